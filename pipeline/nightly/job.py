"""One night: ingest, record, audit, detect, compare, report (``tracelat nightly``).

Order matters for the two promises of the command:

* a failed night (files that cannot be ingested, no run or several, an SLO the
  run cannot evaluate) changes nothing: the night is ingested into a staging
  store that is deleted on any error, and the history rows are written last, in
  one transaction;
* re-running a night with the same input files (same content) adds nothing: the
  night is found by the digest of the files and everything after the recording
  step is redone for it, as of that night.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from . import analysis
from .changepoint import Settings
from .history import History, Night, content_digest, folder_name, labels_of, parse_date


@dataclass(frozen=True)
class Options:
    """Everything ``tracelat nightly`` was asked to do."""

    paths: tuple[Path, ...]
    history: Path
    labels: tuple[tuple[str, str], ...] = ()
    slo: Path | None = None
    baseline: str = "auto"
    out: Path | None = None
    junit: Path | None = None
    run_id: str | None = None
    fmt: str | None = None
    min_change: float = 0.05
    detector: Settings = Settings()


@dataclass
class Outcome:
    """What the night found; ``to_dict`` is the ``--json`` object."""

    night: Night
    recorded: bool
    slo: dict[str, Any] | None
    baseline: str | None
    comparison: dict[str, Any] | None
    change_points: list[analysis.Change]
    new_change_points: list[analysis.Change]
    open_regressions: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)
    markdown: str = ""
    min_change: float = 0.05

    @property
    def failing_changes(self) -> list[analysis.Change]:
        return [c for c in self.new_change_points if analysis.gating(c, self.min_change)]

    @property
    def exit_code(self) -> int:
        slo_failed = self.slo is not None and self.slo["verdict"] != "pass"
        return 1 if slo_failed or self.failing_changes else 0

    def to_dict(self) -> dict[str, Any]:
        cp = lambda c: {
            "metric": c.metric,
            "run_id": c.run_id,
            "night": c.night,
            "before": c.before,  # noqa: E731
            "after": c.after,
            "rel_change": c.rel_change,
            "p_value": c.p_value,
            "worse": c.worse,
        }
        slo = (
            None
            if self.slo is None
            else {
                "verdict": self.slo["verdict"],
                "passed": self.slo["verdict"] == "pass",
                "failed": [c["name"] for c in self.slo["checks"] if c["status"] != "pass"],
            }
        )
        return {
            "run_id": self.night.run_id,
            "night": self.night.night,
            "labels": self.night.labels,
            "recorded": self.recorded,
            "source_run": self.night.source_run,
            "exit_code": self.exit_code,
            "slo": slo,
            "baseline": self.baseline,
            "comparison": self.comparison,
            "change_points": [cp(c) for c in self.change_points],
            "new_change_points": [cp(c) for c in self.new_change_points],
            "open_regressions": self.open_regressions,
            "files": self.files,
        }


def _labels(items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    out = {}
    for key, value in items:
        if not key:
            raise InputError(f"--label {key}={value}: empty key; write KEY=VALUE")
        out[key] = value
    return out


def _remove_store(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        if p.exists():
            p.unlink()


def _stage(opts: Options, hist: History, digest: str, spec: Any) -> Night:
    """Ingest tonight into its own store and record it; nothing stays behind on failure."""
    from .. import audit as aud
    from .. import store
    from ..summary import summary as run_summary
    from ..ingest import ingest_paths
    from .stats import night_statistics

    given = _labels(opts.labels)
    date = parse_date(given.get("date") or dt.datetime.now(dt.timezone.utc).date().isoformat())
    run_id = hist.new_run_id(date, opts.run_id)
    staging = hist.dir / "runs" / f".staging-{os.getpid()}.duckdb"
    final = hist.dir / "runs" / f"{folder_name(run_id, digest)}.duckdb"
    _remove_store(staging)
    con = store.connect(staging)
    try:
        ingest_paths(con, opts.paths, fmt=opts.fmt, run_id=run_id)
        store.build_derived(con)
        runs = store.known_runs(con)
        if len(runs) != 1:
            raise InputError(
                f"tonight's files hold {len(runs)} runs ({', '.join(runs[:5]) or 'none'}); a night is "
                "one run: give the files of one run (records that name no run get the night's id)"
            )
        src = runs[0]
        summary = run_summary(con, src)
        if not summary.get("requests") and not summary.get("iterations"):
            raise InputError(f"run {src!r} has neither requests nor iterations")
        result = aud.audit(con, src, spec) if spec is not None else None
        if result is not None and result.exit_code == 2:
            bad = "; ".join(c.message for c in result.checks if c.status == "error")
            raise InputError(f"an SLO cannot be evaluated on tonight's run: {bad}")
        stats = night_statistics(con, src, summary, result.goodput if result else None)
        labels = labels_of(summary, date, given)
    except BaseException:
        con.close()
        _remove_store(staging)
        raise
    con.close()
    _remove_store(final)  # left by a night that died between these two steps: it is not in the history
    staging.rename(final)
    failed = tuple(c.name for c in result.checks if c.status != "pass") if result else ()
    night = Night(
        0,
        run_id,
        date,
        labels,
        digest,
        src,
        str(final.relative_to(hist.dir)),
        result.verdict if result else None,
        failed,
    )
    try:
        return hist.record(night, stats)
    except BaseException:
        _remove_store(final)
        raise


def run(opts: Options) -> Outcome:
    """The whole night (see the module docstring); raises on a failed night."""
    from .. import audit as aud
    from ..ingest import expand

    spec = aud.load_slo(opts.slo) if opts.slo is not None else None  # a bad SLO file fails before any work
    files = [f for f, _ in expand(Path(p) for p in opts.paths)]
    hist = History(opts.history)
    try:
        if opts.baseline != "auto" and hist.by_id(opts.baseline) is None:
            known = ", ".join(n.run_id for n in hist.nights()[-5:]) or "none yet"
            raise InputError(f"--baseline {opts.baseline!r} is not a night of the history (latest: {known})")
        digest = content_digest(files)
        night = hist.by_digest(digest)
        recorded = night is None
        if night is None:
            night = _stage(opts, hist, digest, spec)
        from .outputs import finish

        return finish(opts, hist, night, recorded, spec)
    finally:
        hist.close()
