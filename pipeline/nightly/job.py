"""One night: ingest, record, audit, detect, compare, report (``tracelat nightly``).

Order matters for the two promises of the command:

* a failed night (files that cannot be ingested, no run or several, an SLO the
  run cannot evaluate) changes nothing: the night is ingested into a staging
  store that is deleted on any error, and the history rows are written last, in
  one transaction;
* re-running a night with the same input files (same content) adds nothing: the
  night is found by the digest of the files and everything after the recording
  step is redone for it, as of that night: with the options it was recorded with
  (SLO file content, --baseline, --min-change, labels), whatever this run gives;
  options that differ are named in a warning (:func:`as_recorded`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..errors import InputError
from . import analysis
from .changepoint import Settings
from .history import History, Night, content_digest, folder_name, labels_of, parse_date
from .sources import refuse_merged_runs


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
    # a re-run: this run's options that differ from the recorded night's (ignored)
    ignored_options: list[str] = field(default_factory=list)
    # the night's date when its [goodput] limits differ from the earlier nights' (its goodput
    # series restart: analysis.goodput_restarts), else None
    goodput_restart: str | None = None
    # what the night's inputs left in doubt (.warnings.night_warnings) and what its comparison
    # with the baseline could not cover
    warnings: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """Lines for the terminal (stderr): the night's warnings, and about a re-run."""
        from ..terminal import clean, one_line

        warned = [f"warning: {one_line(clean(w))}" for w in self.warnings]
        if self.recorded:
            return warned
        n = self.night
        lines = [
            f"Note: these input files were recorded before as night {n.run_id} ({n.night}): nothing was added "
            "to the history; the night is reported as recorded (same verdict, same exit code)"
        ]
        if self.ignored_options:
            lines.append(
                f"Warning: night {n.run_id} was recorded with other options; the options of this run are ignored: "
                + "; ".join(self.ignored_options)
                + ". A recorded night never changes: to record these files with other options, use another --history"
            )
        return lines + warned

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
            "ignored_options": self.ignored_options,
            "goodput_restart": self.goodput_restart,
            "warnings": self.warnings,
            "files": self.files,
        }


def _labels(items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The --label items as a dict; a key given twice is refused (the last one won, with nothing
    said: two date= recorded the night under one of them)."""
    from ..terminal import inline

    out: dict[str, str] = {}
    for key, value in items:
        if not key:
            raise InputError(f"--label {key}={value}: empty key; write KEY=VALUE")
        if key in out:
            raise InputError(
                f"--label {inline(key)} given twice ({inline(key)}={inline(out[key])}, {inline(key)}={inline(value)}): "
                "give each key once"
            )
        out[key] = value
    return out


def _remove_store(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        if p.exists():
            p.unlink()


def _sweep_staging(runs: Path) -> None:
    """Remove the staged stores of nights killed outright (SIGKILL, a machine that went down), which
    nothing else would ever remove. Every one but this process's is such a night's: a night holds the
    history's DuckDB file, which one process at a time can open, from before it stages to the end
    (a PID check would keep, forever, a file whose PID a container or a restored cache reuses)."""
    for p in runs.glob(".staging-*.duckdb"):
        if p.name != f".staging-{os.getpid()}.duckdb":
            _remove_store(p)


def recorded_options(opts: Options, slo_text: str | None) -> dict[str, Any]:
    """What a night keeps of its options, so that a re-run reports it as it was recorded."""
    slo = None
    if opts.slo is not None and slo_text is not None:
        slo = {"path": str(opts.slo), "sha256": hashlib.sha256(slo_text.encode()).hexdigest(), "text": slo_text}
    return {"slo": slo, "baseline": opts.baseline, "min_change": opts.min_change}


def as_recorded(opts: Options, night: Night, spec: Any, slo_text: str | None) -> tuple[Options, Any, list[str]]:
    """The options and SLO spec a recorded night is reported with, and this run's options that
    differ from them (ignored).  A night of an older history (no options kept) keeps this run's
    --baseline and --min-change; its SLO file must give the recorded verdict (:func:`.outputs.finish`)."""
    from ..slo import parse_slo

    given = _labels(opts.labels)
    ignored = [
        f"--label {k}={v} (recorded: " + (f"{k}={night.labels[k]})" if k in night.labels else "no such label)")
        for k, v in given.items()
        if night.labels.get(k) != v
    ]
    if opts.run_id is not None and opts.run_id != night.run_id:
        ignored.append(f"--run-id {opts.run_id} (recorded: {night.run_id})")
    rec = night.options
    if not rec:  # an older history: the SLO file was not kept
        if night.slo_verdict is None and opts.slo is not None:
            ignored.append(f"--slo {opts.slo} (recorded: no SLO file)")
            return replace(opts, slo=None), None, ignored
        return opts, spec, ignored
    slo = rec.get("slo")
    if slo is None and opts.slo is not None:
        ignored.append(f"--slo {opts.slo} (recorded: no SLO file)")
    elif slo is not None and opts.slo is None:
        ignored.append(f"no --slo (recorded: SLO file {slo['path']})")
    elif slo is not None and hashlib.sha256((slo_text or "").encode()).hexdigest() != slo["sha256"]:
        ignored.append(f"--slo {opts.slo} (recorded: SLO file {slo['path']} with other content)")
    if slo is not None:
        try:
            spec = parse_slo(tomllib.loads(slo["text"]), slo["path"])
        except tomllib.TOMLDecodeError as exc:  # written by this code: only a damaged history gets here
            raise InputError(
                f"night {night.run_id}: the SLO file recorded in the history cannot be read: {exc}"
            ) from exc
    else:
        spec = None
    baseline, min_change = rec.get("baseline", opts.baseline), rec.get("min_change", opts.min_change)
    if baseline != opts.baseline:
        ignored.append(f"--baseline {opts.baseline} (recorded: {baseline})")
    if min_change != opts.min_change:
        ignored.append(f"--min-change {opts.min_change:g} (recorded: {min_change:g})")
    path = None if slo is None else Path(slo["path"])
    return replace(opts, slo=path, baseline=baseline, min_change=min_change), spec, ignored


def _first_reject(con: Any, r: Any) -> str:
    """The first reject of file ``r`` with its reason: the night's store is deleted on failure,
    so `tracelat rejects` cannot show them, and this says what is wrong with the file."""
    row = con.execute(
        "select line_no, reason from rejects where path = ? order by line_no limit 1", [r.path]
    ).fetchone()
    return f", the first on line {row[0]}: {row[1]}" if row else ""


def _refuse_empty_files(con: Any, results: list[Any]) -> None:
    """Raise when a file of tonight's loaded nothing, naming each (see :func:`_stage`)."""
    from ..ingest import loaded_nothing, why_nothing
    from ..terminal import clean

    empty = loaded_nothing(results)
    if not empty:
        return
    shown = "; ".join(f"{clean(r.path)} ({why_nothing(r, _first_reject(con, r))})" for r in empty[:5])
    raise InputError(
        f"{len(empty)} of tonight's {len(results)} file(s) loaded nothing: {shown}"
        + (" ..." if len(empty) > 5 else "")
        + "; the night is not recorded: fix or remove those files, or give only the files of the run"
    )


def _refuse_repeated_or_rejected(con: Any, results: list[Any]) -> None:
    """Raise when tonight's files repeat each other's records (yesterday's trace left beside
    tonight's, two copies of one: which of them loses its records depends on their order, so any
    such duplicate fails the night), or a file rejected more lines than it loaded records
    (:func:`.warnings.mostly_rejected`), naming each."""
    from ..terminal import clean
    from .warnings import CROSS_FILE_DUPLICATES, mostly_rejected

    # tonight's store is new: a file it holds already is a byte-for-byte copy of another of tonight's
    copies = [r for r in results if r.status == "unchanged"]
    if copies:
        shown = "; ".join(f"{clean(r.path)} is a copy of {clean(r.stored_as)}" for r in copies[:3])
        raise InputError(
            f"tonight's files repeat each other: {shown}"
            + (" ..." if len(copies) > 3 else "")
            + "; the night is not recorded: remove the copies, or give only tonight's files"
        )
    dups = con.execute(CROSS_FILE_DUPLICATES).fetchall()
    if dups:
        shown = "; ".join(
            f"{clean(path)}: {n} records (the first, line {line}: {clean(reason)})"
            for path, n, line, reason in dups[:3]
        )
        raise InputError(
            f"tonight's files repeat each other's records: {shown}"
            + (" ..." if len(dups) > 3 else "")
            + "; the night is not recorded: a file left from another night, or two copies of one file; "
            "remove the one that is not tonight's, or give only tonight's files"
        )
    bad = mostly_rejected(results)
    if not bad:
        return
    shown = "; ".join(
        f"{clean(r.path)} ({r.rejected} lines rejected, {r.accepted} records loaded{_first_reject(con, r)})"
        for r in bad[:5]
    )
    raise InputError(
        f"{len(bad)} of tonight's {len(results)} file(s) rejected more lines than they loaded: {shown}"
        + (" ..." if len(bad) > 5 else "")
        + "; the night is not recorded: a file left from another night, a damaged file or one of another "
        "run; fix or remove it, or give only the files of the run"
    )


def _stage(opts: Options, hist: History, digest: str, spec: Any, slo_text: str | None) -> Night:
    """Ingest tonight into its own store and record it; nothing stays behind on failure."""
    from .. import audit as aud
    from .. import store
    from ..summary import summary as run_summary
    from ..ingest import ingest_paths
    from .stats import night_statistics

    given = _labels(opts.labels)
    # an empty date= (an unset $DATE in a CI script) is an error, not today
    date = parse_date(given["date"] if "date" in given else dt.datetime.now(dt.timezone.utc).date().isoformat())
    latest = max((n.night for n in hist.nights()), default=None)
    if latest is not None and date < latest:
        # a night slipped in before later ones would change their change points and verdicts,
        # which a re-run of them must reproduce
        raise InputError(
            f"--label date={date} is before the history's latest night ({latest}): nights are added in date "
            "order, so that a recorded night never changes; record older nights into a new --history, oldest first"
        )
    run_id = hist.new_run_id(date, opts.run_id)
    staging = hist.dir / "runs" / f".staging-{os.getpid()}.duckdb"
    final = hist.dir / "runs" / f"{folder_name(run_id, digest)}.duckdb"
    _remove_store(staging)
    if staging.parent.is_dir():
        _sweep_staging(staging.parent)
    con = store.connect(staging)
    try:
        results = ingest_paths(con, opts.paths, fmt=opts.fmt, run_id=run_id)
        # a folder's file that loaded nothing (no known format, every line rejected, empty) fails
        # the night, as it fails `tracelat ingest` and as it does named on its own: otherwise a
        # night whose server log was truncated or garbled is recorded from the other files
        _refuse_empty_files(con, results)
        # files that name no run take the night's id: two runs' files must not become one run
        refuse_merged_runs(con, run_id, results)
        # files repeating each other's records (yesterday's beside tonight's), or a file that lost
        # most of its lines, fail it too: recorded from the rest, the night passes on part of its data
        _refuse_repeated_or_rejected(con, results)
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
        options=recorded_options(opts, slo_text),
    )
    try:
        return hist.record(night, stats)
    except BaseException:
        _remove_store(final)
        raise


def _forget_history(folder: Path, keep_folder: bool) -> None:
    """Remove the history a failed first night created, and the folder too when it made it."""
    if not keep_folder:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for name in ("history.duckdb", "history.duckdb.wal"):
        (folder / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # only when empty: anything else there is the user's
        (folder / "runs").rmdir()


def check_options(opts: Options) -> None:
    """Refuse a bad option before the night is looked up, so that a re-run refuses what a new night
    would (it reports the recorded night with that night's options, but a typo in this run's is an
    error either way): the labels, a --label date=, --run-id and --format.  The SLO file is loaded
    and --baseline looked up in the history before the lookup too (:func:`run`)."""
    from ..ingest import check_run_id_option, get

    given = _labels(opts.labels)
    if "date" in given:  # an empty date= (an unset $DATE in a CI script) is an error, not today
        parse_date(given["date"])
    if opts.run_id is not None:
        check_run_id_option(opts.run_id)
    if opts.fmt:
        get(opts.fmt)


def run(opts: Options) -> Outcome:
    """The whole night (see the module docstring); raises on a failed night."""
    from .. import audit as aud
    from ..ingest import expand

    check_options(opts)
    spec = aud.load_slo(opts.slo) if opts.slo is not None else None  # a bad SLO file fails before any work
    slo_text = opts.slo.read_text(encoding="utf-8") if opts.slo is not None else None
    files = [f for f, _ in expand(Path(p) for p in opts.paths)]
    folder = Path(opts.history)
    had_folder, fresh = folder.exists(), not (folder / "history.duckdb").exists()
    hist = History(opts.history)
    ok = False
    try:
        if opts.baseline != "auto" and hist.by_id(opts.baseline) is None:
            known = ", ".join(n.run_id for n in hist.nights()[-5:]) or "none yet"
            raise InputError(f"--baseline {opts.baseline!r} is not a night of the history (latest: {known})")
        digest = content_digest(files)
        night = hist.by_digest(digest)
        from .outputs import finish
        from .undo import outputs_undone_on_error

        if night is None:
            night = _stage(opts, hist, digest, spec, slo_text)
            try:
                # a failure leaves no report folder of a night the history does not hold
                with outputs_undone_on_error(opts, hist, night):
                    outcome = finish(opts, hist, night, True, spec)
            except BaseException:
                # the report, comparison or JUnit could not be written: tonight is not recorded,
                # so the next night is compared and gated as if this one never ran
                hist.forget(night)
                _remove_store(hist.dir / night.store)
                raise
        else:  # a re-run: reported as recorded, with the options it was recorded with
            rerun, spec, ignored = as_recorded(opts, night, spec, slo_text)
            with outputs_undone_on_error(opts, hist, night):
                outcome = finish(rerun, hist, night, False, spec, ignored)
        ok = True
        return outcome
    finally:
        empty = False
        if not ok and fresh:
            with contextlib.suppress(Exception):
                empty = not hist.nights()
        hist.close()
        if empty:  # a failed first night leaves no history behind, as a failed later one changes none
            _forget_history(folder, had_folder)
