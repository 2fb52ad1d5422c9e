"""Exceptions that the CLI turns into one ``Error: ...`` line and an exit code."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator


class TracelatError(Exception):
    """A problem with the user's input or data; exit code 2."""

    exit_code = 2


class InputError(TracelatError):
    """A file or argument cannot be used as given."""


class UnknownFormat(InputError):
    """No ingestor recognises the file ``path``; ``after``: what the command did before it."""

    def __init__(self, message: str, path: object = None, after: str = ""):
        super().__init__(message + (f" ({after})" if after else ""))
        self.path, self.after = path, after


class StoreError(TracelatError):
    """The DuckDB store cannot be opened or is in a bad state."""


class CheckFailed(TracelatError):
    """A check ran and failed (SLO violation, regression); exit code 1."""

    exit_code = 1


@contextlib.contextmanager
def writing(option: str, path: object) -> Iterator[None]:
    """Turn a failure to write an output (no such folder, permission denied, disk full,
    ``--junit /dev/full``) into an error naming the option and path: a user's problem,
    exit 2, not an internal error."""
    try:
        yield
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InputError(f"cannot write {option} {path}: {why}; choose a writable path (or free disk space)") from exc


MAX_MESSAGE = 1000


def one_line(exc: BaseException) -> str:
    """The message on one line and at most MAX_MESSAGE characters: library errors can run
    over several lines, and some quote the whole offending input (12 KB of nested JSON)."""
    text = re.sub(r"[ \t]*\n\s*", " ", str(exc).strip())  # other control characters: echo's clean()
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f" ... ({len(text)} characters)"
