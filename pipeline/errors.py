"""Exceptions that the CLI turns into one ``Error: ...`` line and an exit code."""

from __future__ import annotations


class TracelatError(Exception):
    """A problem with the user's input or data; exit code 2."""

    exit_code = 2


class InputError(TracelatError):
    """A file or argument cannot be used as given."""


class StoreError(TracelatError):
    """The DuckDB store cannot be opened or is in a bad state."""


class CheckFailed(TracelatError):
    """A check ran and failed (SLO violation, regression); exit code 1."""

    exit_code = 1
