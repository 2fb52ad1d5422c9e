"""The nightly history: ``DIR/history.duckdb`` plus one run store per night.

``DIR/runs/<night>.duckdb`` holds the night's run exactly as ``tracelat ingest``
would (so ``report``, ``compare`` and ``replay --db`` work on it); keeping one file
per night means a run id two nights share (engines name their runs after a
config) never merges them, and a failed night removes its own file and nothing
else.  ``history.duckdb`` has two tables:

* ``nightly_runs``: one row per night: id, date, labels (JSON), the digest of its
  input files (a re-run with the same content adds nothing), the run id inside
  its store, SLO verdict and failed checks, report folder;
* ``nightly_history``: one row per night per headline statistic, with its
  confidence interval (:mod:`.stats`);
* ``nightly_changes``: a cache of the change points found on a list of nights
  (rows of recorded nights never change, so the same nights give the same answer).

A night's rows are written in one transaction, after everything that can fail on
bad input has run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from ..compare import CONFIG_META_KEYS, CONFIG_RUN_KEYS
from ..errors import InputError, StoreError
from ..store import transaction
from .stats import Stat

SCHEMA = """
create table if not exists nightly_runs (
    seq bigint, run_id varchar, night date, labels json, digest varchar, source_run varchar,
    store varchar, slo_verdict varchar, slo_failed varchar[], report varchar, t_recorded timestamp,
    options json
);
-- histories written before the night's options were kept
alter table nightly_runs add column if not exists options json;
create table if not exists nightly_history (
    run_id varchar, seq bigint, night date, metric varchar, value double, ci_low double, ci_high double
);
-- change points found on a list of nights with given settings (key: digest of both), so that
-- tonight's "new" test reuses what last night found instead of searching that history again
create table if not exists nightly_changes (key varchar, changes json);
"""

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class Night:
    """One night of the history."""

    seq: int
    run_id: str
    night: str  # ISO date
    labels: dict[str, str] = field(default_factory=dict)
    digest: str = ""
    source_run: str = ""
    store: str = ""  # relative to the history folder
    slo_verdict: str | None = None
    slo_failed: tuple[str, ...] = ()
    report: str | None = None
    # the options the night was recorded with (:func:`pipeline.nightly.job.recorded_options`): the SLO
    # file's path and content, --baseline, --min-change; empty for nights of an older history
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No SLO violation recorded (a night audited without an SLO file passes)."""
        return self.slo_verdict in (None, "pass")


def parse_date(text: str) -> str:
    """An ISO date (``YYYY-MM-DD``), checked; nights are ordered by it."""
    if not _DATE.match(text or ""):
        raise InputError(f"--label date={text!r}: expected an ISO date, YYYY-MM-DD")
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError as exc:
        raise InputError(f"--label date={text!r}: {exc}") from exc


def content_digest(files: list[Path]) -> str:
    """SHA-256 over the files' contents, independent of their names and order."""
    parts = []
    for f in files:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        parts.append(h.hexdigest())
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


def safe_id(text: str) -> str:
    """A night id as a file name (ids may come from labels: no ``/``, no ``..``)."""
    from ..report.render import safe_name

    return safe_name(text, 80)


def folder_name(run_id: str, digest: str) -> str:
    """The night's file and folder name: its id, made safe; with the input digest appended when
    that changed it, so that two ids reduced to one name (``a/b``, ``a_b``) never share files."""
    safe = safe_id(run_id)
    return safe if safe == run_id else f"{safe}-{digest[:12]}"


class History:
    """The history folder; one process at a time writes it (DuckDB's lock)."""

    def __init__(self, folder: str | Path):
        self.dir = Path(folder)
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"--history {self.dir}: not a folder")
        (self.dir / "runs").mkdir(parents=True, exist_ok=True)
        path = self.dir / "history.duckdb"
        try:
            self.con = duckdb.connect(str(path.absolute()))  # DuckDB reads a leading "~" as the home folder
        except duckdb.Error as exc:
            hint = (
                "another nightly job running?"
                if "lock" in str(exc).lower()
                else "the file is damaged or no DuckDB database: restore it from where the history is kept, "
                "or start a new --history"
            )
            raise StoreError(f"cannot open the nightly history {path}: {exc} ({hint})") from exc
        self.con.execute(SCHEMA)

    def close(self) -> None:
        self.con.close()

    def nights(self) -> list[Night]:
        """Every night, in history order (date, then the order they were recorded)."""
        rows = self.con.execute(
            "select seq, run_id, night::varchar, labels, digest, source_run, store, slo_verdict, slo_failed, report, "
            "options from nightly_runs order by night, seq"
        ).fetchall()
        return [
            Night(
                r[0],
                r[1],
                r[2],
                json.loads(r[3]) if r[3] else {},
                r[4],
                r[5],
                r[6],
                r[7],
                tuple(r[8] or ()),
                # a report inside the history is kept relative to it: the history may move (a CI cache)
                None if r[9] is None else str((self.dir / r[9]).resolve()),
                json.loads(r[10]) if r[10] else {},
            )
            for r in rows
        ]

    def by_digest(self, digest: str) -> Night | None:
        return next((n for n in self.nights() if n.digest == digest), None)

    def by_id(self, run_id: str) -> Night | None:
        return next((n for n in self.nights() if n.run_id == run_id), None)

    def new_run_id(self, date: str, wanted: str | None = None) -> str:
        """``wanted`` (refused if taken), else the date, ``DATE.2``, ``DATE.3``, ... (the first free one)."""
        taken = {n.run_id for n in self.nights()}
        if wanted is not None:
            if wanted in taken:
                raise InputError(f"--run-id {wanted!r} is already in the history with other content; choose another id")
            return wanted
        candidate, k = date, 1
        while candidate in taken:
            k += 1
            candidate = f"{date}.{k}"
        return candidate

    def store_path(self, night: Night) -> Path:
        return self.dir / night.store

    def record(self, night: Night, stats: list[Stat]) -> Night:
        """Add a night and its statistics in one transaction; returns it with its sequence number."""
        with transaction(self.con):  # a failed commit reports its cause, not "no transaction is active"
            seq = int(self.con.execute("select coalesce(max(seq), 0) + 1 from nightly_runs").fetchone()[0])
            self.con.execute(
                "insert into nightly_runs (seq, run_id, night, labels, digest, source_run, store, slo_verdict, "
                "slo_failed, report, t_recorded, options) values ($seq, $id, $night::date, $labels, $digest, $src, "
                "$store, $verdict, $failed, $report, now()::timestamp, $options)",
                {
                    "seq": seq,
                    "id": night.run_id,
                    "night": night.night,
                    "labels": json.dumps(night.labels),
                    "digest": night.digest,
                    "src": night.source_run,
                    "store": night.store,
                    "verdict": night.slo_verdict,
                    "failed": list(night.slo_failed),
                    "report": night.report,
                    "options": json.dumps(night.options),
                },
            )
            if stats:
                frame = pl.DataFrame(
                    {
                        "metric": [s.metric for s in stats],
                        "value": [s.value for s in stats],
                        "ci_low": [s.ci_low for s in stats],
                        "ci_high": [s.ci_high for s in stats],
                    },
                    schema={"metric": pl.Utf8, "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64},
                )
                self.con.register("_night_stats", frame)
                self.con.execute(
                    "insert into nightly_history select $id, $seq, $night::date, metric, value, ci_low, "
                    "ci_high from _night_stats",
                    {"id": night.run_id, "seq": seq, "night": night.night},
                )
                self.con.unregister("_night_stats")
        return dataclasses.replace(night, seq=seq)

    def forget(self, night: Night) -> None:
        """Remove a night recorded by this command whose outputs failed: a failed night changes no history."""
        with transaction(self.con):
            self.con.execute("delete from nightly_history where run_id = ?", [night.run_id])
            self.con.execute("delete from nightly_runs where run_id = ?", [night.run_id])

    def series(self) -> pl.DataFrame:
        """``nightly_history`` in history order: run_id, seq, night, metric, value, ci_low, ci_high."""
        return self.con.sql(
            "select h.run_id, h.seq, h.night::varchar as night, h.metric, h.value, h.ci_low, h.ci_high "
            "from nightly_history h order by h.night, h.seq, h.metric"
        ).pl()


def config_digest(run: dict[str, Any]) -> str | None:
    """12 hex digits of the run's configuration (:data:`CONFIG_RUN_KEYS`, :data:`CONFIG_META_KEYS`);
    ``None`` when the run records none of it.  Nights with the same settings share a digest."""
    meta = run.get("meta") if isinstance(run.get("meta"), dict) else {}
    config = {f"run.{k}": run[k] for k in CONFIG_RUN_KEYS if run.get(k) is not None}
    config |= {k: meta[k] for k in CONFIG_META_KEYS if meta.get(k) is not None}
    if not config:
        return None
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def labels_of(summary: dict[str, Any], date: str, given: dict[str, str]) -> dict[str, str]:
    """Date, commit, engine version and config of a night, plus the ``--label`` items (which win).

    The commit comes from the CI's usual variables when no label gives it; the config
    is a short digest of the run's configuration (:func:`config_digest`).
    """
    import os

    run = summary.get("run") or {}
    out: dict[str, str] = {"date": date}
    commit = next((os.environ[v] for v in ("GITHUB_SHA", "CI_COMMIT_SHA", "GIT_COMMIT") if os.environ.get(v)), None)
    if commit:
        out["commit"] = commit
    for key in ("engine", "engine_version", "model", "gpu"):
        if run.get(key):
            out[key] = str(run[key])
    config = config_digest(run)
    if config:
        out["config"] = config
    out.update(given)
    return out


def set_report(hist: History, run_id: str, folder: Path) -> None:
    """Remember where a night's report was written (the trend page links to it): relative to the
    history when inside it, so that links survive the history folder being moved or restored."""
    where, root = Path(folder).resolve(), hist.dir.resolve()
    where = where.relative_to(root) if where.is_relative_to(root) else where  # else an --out outside it
    hist.con.execute("update nightly_runs set report = $r where run_id = $id", {"r": str(where), "id": run_id})


def reset_report(hist: History, night: Night) -> None:
    """Point the history back at the report folder ``night`` was read with (a failed re-run)."""
    hist.con.execute("update nightly_runs set report = $r where run_id = $id", {"r": night.report, "id": night.run_id})


def changes_key(nights: list[Night], settings: object) -> str:
    """Cache key of a change-point search: the nights searched, in order, and the settings."""
    # "goodput-restarts": searches since goodput series restart on new [goodput] limits; a cache
    # entry of an earlier version (one goodput series over all limits) is not reused
    text = "\0".join(["goodput-restarts", repr(settings), *(n.run_id for n in nights)])
    return hashlib.sha256(text.encode()).hexdigest()


def cached_changes(hist: History, key: str) -> list[dict] | None:
    row = hist.con.execute("select changes from nightly_changes where key = $k", {"k": key}).fetchone()
    return None if row is None else json.loads(row[0])


def cache_changes(hist: History, key: str, changes: list[dict]) -> None:
    hist.con.execute("delete from nightly_changes where key = $k", {"k": key})
    hist.con.execute("insert into nightly_changes values ($k, $c)", {"k": key, "c": json.dumps(changes)})
