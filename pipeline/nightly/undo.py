"""A night that fails while writing its outputs leaves them as they were (:func:`outputs_undone_on_error`).

:func:`.outputs.finish` writes tonight's report folder, its comparison, the JUnit file, the
Markdown summary, the trend page and ``nightly.json`` in turn; a failure half-way (a baseline
night's store missing, an unwritable --junit) exits 2 with the night not recorded, and must not
leave a report folder of a night the history does not hold, nor a trend page that shows it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .history import History, Night, folder_name, reset_report

# the files of --out that every night rewrites (the report folder is the night's own)
SHARED = ("index.html", "nightly.json")


def out_dir(opts: Any, hist: History) -> Path:
    """Where a night's outputs go: --out, default HISTORY/reports."""
    return Path(opts.out) if opts.out is not None else hist.dir / "reports"


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist (made by writing there), or None."""
    missing = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def _content(path: Path) -> bytes | None:
    """The file's bytes, None when there is none; OSError when it cannot be read (left alone then)."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


@contextlib.contextmanager
def outputs_undone_on_error(opts: Any, hist: History, night: Night) -> Iterator[None]:
    """On any exception inside: remove the folders the night's outputs made (its report folder, an
    --out that was not there), put back the trend page and ``nightly.json`` as they were, and the
    report folder the history names for the night (a re-run sets it); then re-raise."""
    out = out_dir(opts, hist)
    night_dir = out / folder_name(night.run_id, night.digest)
    made = [p for p in (_first_missing(out), _first_missing(night_dir)) if p is not None]
    kept: dict[Path, bytes | None] = {}
    for name in SHARED:
        with contextlib.suppress(OSError):  # unreadable: not ours to touch
            kept[out / name] = _content(out / name)
    try:
        yield
    except BaseException:
        for path, content in kept.items():
            with contextlib.suppress(OSError):
                if content is None:
                    path.unlink(missing_ok=True)
                else:
                    path.write_bytes(content)
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(Exception):  # a re-run pointed the history at this run's --out
            reset_report(hist, night)
        raise
