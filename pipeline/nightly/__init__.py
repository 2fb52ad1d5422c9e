"""Nightly runs: a history across nights, change-point detection, a trend page.

``tracelat nightly`` (:mod:`.job`) ingests a night's files into its own store,
records its headline statistics (:mod:`.stats`) in ``HISTORY/history.duckdb``
(:mod:`.history`), detects change points in every statistic's history with
E-divisive means (:mod:`.changepoint`, :mod:`.analysis`) and writes the report,
comparison, Markdown summary (:mod:`.summary`) and trend page (:mod:`.trend`).
"""
