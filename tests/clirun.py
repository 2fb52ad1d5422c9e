"""The CLI run in the test's own process, shaped like ``subprocess.run``'s result.

A ``python -m pipeline`` per call costs an interpreter start and every import (1-2 s on a
busy 2-core machine) and dominated tests that check many messages.  Tests of the process
itself (exit status of ``python -m``, environment variables read at start) keep a subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path


@contextlib.contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(*args: object, cwd: Path | str | None = None, env: Mapping[str, str] | None = None):
    """``tracelat ARGS`` in process: a CompletedProcess with the exit code, stdout and stderr apart."""
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(_environ(env))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
