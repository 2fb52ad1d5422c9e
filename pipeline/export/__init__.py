"""Exports of a run for other tools: Perfetto/Chrome traces (:mod:`.perfetto`)."""
