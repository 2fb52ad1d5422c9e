"""After a night is in the history: detect, pick the baseline, compare, write the files.

Folder layout under ``--out`` (default ``HISTORY/reports``)::

    index.html                 the trend page (every night, every statistic)
    nightly.json               what ``--json`` prints, for tonight
    <night>/index.html         tonight's report (+ summary.json, summary.md)
    <night>/nightly.md         the Markdown summary
    <night>/compare/           the comparison with the baseline (when there is one)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from . import analysis
from .history import History, Night, folder_name, set_report
from .undo import out_dir
from .warnings import label_overrides, night_warnings


def _changes(hist: History, series: Any, nights: list[Night], settings: Any) -> list[analysis.Change]:
    """Change points on ``nights``, from the cache when this search was done before."""
    from .history import cache_changes, cached_changes, changes_key

    key = changes_key(nights, settings)
    hit = cached_changes(hist, key)
    if hit is not None:
        return [analysis.Change(**c) for c in hit]
    found = analysis.changes(series, nights, settings)
    cache_changes(hist, key, [c.to_dict() for c in found])
    return found


# A change point found as of any of the last this many nights is not new when found again: a
# regression's change point can drop out of a search as the nights after it come in (its level
# scatters back towards the old one) and return, and it failed the gate each time it returned.
REPORTED_NIGHTS = 7


def _as_of(hist: History, night: Night, opts: Any) -> tuple[list[Night], list[Night], Any, list, list]:
    """Nights up to ``night``, all nights, the series, the changes as of ``night``, and those found
    as of each of the ``REPORTED_NIGHTS`` nights before it (searches cached when those nights ran)."""
    nights = hist.nights()
    pos = [n.run_id for n in nights].index(night.run_id)
    upto = nights[: pos + 1]
    series = hist.series()
    found = _changes(hist, series, upto, opts.detector)
    before = [
        c
        for back in range(1, min(pos, REPORTED_NIGHTS) + 1)
        for c in _changes(hist, series, upto[:-back], opts.detector)
    ]
    return upto, nights, series, found, before


def _compare(base: Night, night: Night, hist: History, con: Any, out_dir: Path) -> dict[str, Any]:
    from .. import store
    from ..compare import compare
    from ..report.compare_page import write_comparison

    path = hist.store_path(base)
    if not path.exists():  # connect would make an empty store there and blame the run
        raise InputError(
            f"the store of baseline night {base.run_id} ({path}) is missing from the history: restore it "
            "(e.g. from the cache or artifact the history came from), or pass --baseline NIGHT"
        )
    base_con = store.connect(path, must_exist=True)
    try:
        store.build_derived(base_con)
        comp = compare(base_con, base.source_run, con, night.source_run)
        html = write_comparison(comp, base_con, con, out_dir)
    finally:
        base_con.close()
    return {
        "base_run": base.run_id,
        "regressions": [f"{d.metric}.{d.stat}" for d in comp.regressions],
        "improvements": [f"{d.metric}.{d.stat}" for d in comp.deltas if d.verdict == "improvement"],
        "warnings": list(comp.warnings),
        "html": str(html),
    }


def _check_verdict(night: Night, audit: Any) -> None:
    """A re-run reports the verdict the night was recorded with; refuse (before writing anything)
    when its SLO spec no longer gives it (a night of an older history re-run with another SLO file)."""
    verdict = audit.verdict if audit is not None else None
    failed = tuple(c.name for c in audit.checks if c.status != "pass") if audit is not None else ()
    if (verdict, failed) == (night.slo_verdict, night.slo_failed):
        return
    was = "without an SLO file" if night.slo_verdict is None else f"with SLO verdict {night.slo_verdict}"
    now = "no SLO file" if audit is None else f"SLO file {audit.slo_path} gives {verdict}"
    raise InputError(
        f"night {night.run_id} was recorded {was}"
        + (f" (failed: {', '.join(night.slo_failed)})" if night.slo_failed else "")
        + f", and the history does not hold the SLO file it used (written by an older tracelat); {now}: "
        "a re-run never changes a recorded night: give the SLO file it was recorded with (or use another --history)"
    )


def finish(opts: Any, hist: History, night: Night, recorded: bool, spec: Any, ignored: list[str] | None = None):
    """Everything after recording: returns the :class:`~.job.Outcome`.  For a re-run
    (``recorded`` false) ``opts`` and ``spec`` are those the night was recorded with
    (:func:`.job.as_recorded`); ``ignored`` names this run's options that differed."""
    from .. import audit as aud
    from .. import store
    from ..errors import writing
    from ..jsonplain import dumps
    from ..report import write_report
    from .job import Outcome
    from .summary import markdown
    from .trend import write_trend

    out = out_dir(opts, hist)
    night_dir = out / folder_name(night.run_id, night.digest)
    upto, nights, series, found, before = _as_of(hist, night, opts)
    new = analysis.new_changes(found, before)
    if opts.baseline == "auto":
        base = analysis.auto_baseline(upto, night, found)
    else:
        base = hist.by_id(opts.baseline)
    con = store.connect(hist.store_path(night))
    try:
        store.build_derived(con)
        audit = aud.audit(con, night.source_run, spec) if spec is not None else None
        if not recorded:
            _check_verdict(night, audit)
        html = write_report(con, night.source_run, night_dir, slo=spec)
        comparison = _compare(base, night, hist, con, night_dir / "compare") if base is not None else None
        warnings = night_warnings(con, night.source_run, str(hist.store_path(night)))
        warnings += label_overrides(con, night.source_run, night.labels)
    finally:
        con.close()
    if comparison:
        warnings += [f"compare with night {base.run_id}: {w}" for w in comparison["warnings"]]
    set_report(hist, night.run_id, night_dir)
    openr = analysis.open_regressions(found, series, upto, opts.min_change)
    outcome = Outcome(
        night,
        recorded,
        audit.to_dict() if audit else None,
        base.run_id if base else None,
        comparison,
        found,
        new,
        openr,
        min_change=opts.min_change,
        ignored_options=list(ignored or []),
        goodput_restart=night.night if len(upto) - 1 in analysis.goodput_restarts(upto) else None,
        warnings=warnings,
    )
    outcome.markdown = markdown(outcome, series, upto)
    if opts.junit:
        from .junit import nightly_junit

        tonight = series.filter(series["run_id"] == night.run_id)["metric"].to_list()
        with writing("--junit", opts.junit):
            Path(opts.junit).parent.mkdir(parents=True, exist_ok=True)
            Path(opts.junit).write_bytes(nightly_junit(aud.junit_xml(audit) if audit else None, outcome, tonight))
    (night_dir / "nightly.md").write_text(outcome.markdown, encoding="utf-8")
    # the trend page shows the whole history, even when an earlier night was re-run
    everything = found if len(upto) == len(nights) else _changes(hist, series, nights, opts.detector)
    trend = write_trend(
        out,
        hist.nights(),
        series,
        everything,
        analysis.open_regressions(everything, series, nights, opts.min_change),
        opts.min_change,
    )
    outcome.files = {
        "report": str(html),
        "summary_md": str(night_dir / "nightly.md"),
        "trend": str(trend),
        "json": str(out / "nightly.json"),
    }
    if comparison:
        outcome.files["compare"] = comparison["html"]
    if opts.junit:
        outcome.files["junit"] = str(opts.junit)
    (out / "nightly.json").write_text(dumps(outcome.to_dict()) + "\n", encoding="utf-8")
    return outcome
