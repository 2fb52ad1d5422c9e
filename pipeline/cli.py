"""The ``tracelat`` command line: a thin click layer over importable functions.

Commands live in ``pipeline/commands/`` and are imported only when used, so
``tracelat --help`` stays fast.  One handler in :func:`main` turns our exceptions
into ``Error: ...`` and an exit code (2 usage/data error, 1 a failed check);
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys

import click

from . import __version__
from .errors import MAX_MESSAGE, TracelatError, one_line  # noqa: F401  (MAX_MESSAGE: part of this module's API)
from .terminal import OutputClosed, echo

# name -> (module, attribute, one-line help shown by `tracelat --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "ingest": ("pipeline.commands.ingest", "ingest", "Load trace files (any known format) into the store."),
    "runs": ("pipeline.commands.runs", "runs", "List the runs in the store."),
    "rejects": (
        "pipeline.commands.rejects",
        "rejects",
        "Show the lines ingest rejected, with line numbers and reasons.",
    ),
    "summary": ("pipeline.commands.summary", "summary", "Latency summary of a run (TTFT, TPOT, ITL, ...)."),
    "simulate": ("pipeline.commands.simulate", "simulate", "Generate a synthetic trace with known ground truth."),
    "demo": (
        "pipeline.commands.demo",
        "demo",
        "The main job on the bundled incident trace: ingest, summary, HTML report.",
    ),
    "report": ("pipeline.commands.report", "report", "Offline HTML report, summary.json and summary.md of a run."),
    "audit": (
        "pipeline.commands.audit",
        "audit",
        "Check a run against SLOs (percentiles, goodput, fluidity); JUnit XML.",
    ),
    "compare": (
        "pipeline.commands.compare",
        "compare",
        "Compare two runs: deltas with bootstrap CIs; flag regressions.",
    ),
    "fit": (
        "pipeline.commands.fit",
        "fit",
        "Fit the memory-bound iteration-time model; stalls; iteration-time claims checked.",
    ),
    "check": (
        "pipeline.commands.check",
        "check",
        "Check a run against the invariants (TTFT = queue + prefill, sums, order).",
    ),
    "explain": (
        "pipeline.commands.explain",
        "explain",
        "Why is the TTFT/TPOT/E2E tail slow? p99 attribution to causes.",
    ),
    "replay": (
        "pipeline.commands.replay",
        "replay",
        "Replay a run through the simulator: validation, what-if, sweeps.",
    ),
    "export": ("pipeline.commands.export", "export", "Export a run for other tools: a Perfetto/Chrome timeline."),
    "fleet": ("pipeline.commands.fleet", "fleet", "Analyse every run of a Parquet lake: fleet percentiles, outliers."),
    "record-fpm": (
        "pipeline.commands.record_fpm",
        "record_fpm",
        "Record an engine's ForwardPassMetrics ZMQ stream to JSONL.",
    ),
    "nightly": (
        "pipeline.commands.nightly",
        "nightly",
        "One command per night: history, SLOs, baseline, change points, trend page.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
# read by main() from the arguments, not here: its error handler runs after click has returned
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(__version__, prog_name="tracelat")
def cli(debug: bool) -> None:
    """tracelat: why is my LLM serving latency what it is?

    Ingest per-iteration and per-request logs of a serving run (vLLM, SGLang,
    TensorRT-LLM, benchmark clients, or the canonical JSONL format), then ask for
    TTFT/TPOT/ITL and iteration-time statistics.  Every command that touches the
    store takes --db (default tracelat.duckdb, or $TRACELAT_DB).

    \b
    Quick start:
      tracelat demo --open          # bundled incident: ingest, summary, HTML report
      tracelat ingest logs/         # ingest every file under logs/
      tracelat runs                 # list runs
      tracelat summary RUN --json   # summary.json on stdout

    Documentation: docs/ in the repository (docs/cli.md lists every command).
    """


class _Termination:
    """SIGTERM (a CI job's timeout or cancel, ``kill``) raised as an interrupt while a command runs, so
    that what a command undoes on an interrupt (a night's staged store and history rows, an ingest's
    open transaction) is undone on it too; Python's default would end the process where it stands."""

    received = False

    @classmethod
    def handler(cls, signum, frame) -> None:
        if cls.received:  # a second SIGTERM (a CI runner may repeat it) must not break into the undoing
            return
        cls.received = True
        raise KeyboardInterrupt

    @classmethod
    @contextlib.contextmanager
    def raised(cls):
        import signal
        import threading

        if (
            threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        ):
            yield  # a host that handles SIGTERM itself keeps its handler (a nested call too: ours)
            return
        cls.received = False
        signal.signal(signal.SIGTERM, cls.handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_if_terminated() -> None:
    """Exit 143 (128 + SIGTERM, as a shell reports a process it ended) once SIGTERM was received."""
    if _Termination.received:
        echo("Terminated.", err=True)
        sys.exit(143)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI with the single error handler."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    with _Termination.raised():
        _main(args, debug)


def _main(args: list[str], debug: bool) -> None:
    try:
        cli.main(args=args, prog_name="tracelat", standalone_mode=False)
        sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
    except (OutputClosed, BrokenPipeError):
        # nothing more can be shown; later flushes go nowhere instead of raising again
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(OutputClosed.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, EOFError) and not debug:
            # click turns an EOFError into Abort; ours come from a truncated compressed file
            # that some reader did not catch, not from the user: an error, not an interrupt
            echo(
                f"Error: unexpected end of data: {one_line(exc.__cause__) or 'a compressed file is truncated'} "
                "(run with --debug for the traceback)",
                err=True,
            )
            sys.exit(2)
        _exit_if_terminated()
        echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        shown = io.StringIO()  # click's message may quote the arguments: cleaned like all output
        exc.show(file=shown)
        echo(shown.getvalue(), err=True, nl=False)
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except TracelatError as exc:
        if not debug:  # an interrupted query that a step wrapped in its own error
            _exit_if_terminated()
        if debug:
            raise
        echo(f"Error: {one_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # the machine's trouble (disk full, permissions), not a bug of ours
        if debug:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        echo(
            f"Error: cannot read or write{where}: {one_line(exc) if exc.strerror is None else exc.strerror} "
            "(run with --debug for the traceback)",
            err=True,
        )
        sys.exit(2)
    except Exception as exc:  # an unexpected failure: say so plainly, keep the exit code distinct
        if not debug:  # the interrupt surfaced through DuckDB ("Query interrupted"), which checks for signals itself
            _exit_if_terminated()
        if debug:
            raise
        import duckdb

        from . import store

        if store.interrupted(exc):
            echo("Aborted.", err=True)  # Ctrl-C inside a query: an interrupt, not a failure of ours
            sys.exit(130)

        if isinstance(exc, duckdb.Error):
            echo(f"Error: database error: {one_line(exc)} (run with --debug for the traceback)", err=True)
            sys.exit(2)
        echo(
            f"Error: internal error: {type(exc).__name__}: {one_line(exc)} (run with --debug for the traceback)",
            err=True,
        )
        sys.exit(3)


if __name__ == "__main__":
    main()


def run_captured(*args: object) -> tuple[int, str]:
    """Run the CLI in this process with ``args``; returns (exit code, stdout and stderr together).

    For scripts and tests that check what a user would see, without a subprocess per call.
    """
    import contextlib

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue()
