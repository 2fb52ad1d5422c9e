"""A command that writes JUnit XML (``--junit FILE``) and fails (exit 2) rewrites that file with
one ``<error>`` testcase naming the error: a CI job must never show an earlier, passing file of a
run that did not happen.  Shared by ``nightly``, ``audit`` and ``fleet``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from ..errors import TracelatError


def message(exc: BaseException) -> str:
    """The error as the CLI's handler words it (one line)."""
    from ..errors import one_line

    if isinstance(exc, click.ClickException):
        return exc.format_message()
    if isinstance(exc, TracelatError):
        return one_line(exc)
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return f"cannot read or write{where}: {exc.strerror or one_line(exc)}"
    return f"{type(exc).__name__}: {one_line(exc)}"


def write_error(path: Path, exc: BaseException, command: str) -> None:
    """Replace the --junit file by one ``<error>`` testcase.  A path that cannot be written
    leaves the first error to report."""
    from ..nightly.junit import error_junit

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(error_junit(f"tracelat {command} failed: {message(exc)}", command=command))
    except OSError:
        pass


@contextlib.contextmanager
def junit_on_error(path: Path | None, command: str) -> Iterator[None]:
    """Rewrite ``path`` (when given) with the error of any exception raised inside, then re-raise."""
    try:
        yield
    except Exception as exc:  # exit 2 (or 3): the command failed, whatever the cause
        if path is not None:
            write_error(path, exc, command)
        raise


def junit_in(args: list[str]) -> Path | None:
    """The --junit path of a command line click refused, if it names one (the last wins, as for click)."""
    path = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--junit" and i + 1 < len(args):
            path = args[i + 1]
        elif arg.startswith("--junit="):
            path = arg.removeprefix("--junit=")
    return Path(path) if path else None


class JunitOnUsageError(click.Command):
    """Click refuses a bad argument or option value (``--min-change -1``, a LAKE that does not
    exist) before the command runs: the --junit file is rewritten with that error too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            path = junit_in(given)
            if path is not None:
                write_error(path, exc, self.name or "")
            raise
