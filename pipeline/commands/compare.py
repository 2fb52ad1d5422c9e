"""``tracelat compare``."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CheckFailed, writing
from ..settings import finite_float
from ..terminal import echo, inline
from .options import db_option, lake_option, open_source, dumps, json_option, seed_option


@click.command()
@click.argument("base_run")
@click.argument("cand_run")
@db_option
@lake_option
@click.option(
    "--base-db",
    type=click.Path(dir_okay=False),
    help="Store holding BASE_RUN, when it is not --db (e.g. a kept baseline store).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for index.html, comparison.json, comparison.md (default reports/compare_<base>_vs_<cand>/).",
)
@click.option(
    "--threshold",
    default=0.05,
    show_default=True,
    type=finite_float(0, None),
    help="Relative growth a statistic must exceed to count as a regression (0.05 = 5%).",
)
@click.option(
    "--confidence",
    default=0.99,
    show_default=True,
    type=finite_float(0.5, 0.9999),
    help="Confidence level of the bootstrap intervals.",
)
@click.option(
    "--resamples",
    default=2000,
    show_default=True,
    type=click.IntRange(100, None),
    help="Bootstrap resamples per statistic.",
)
@click.option(
    "--unpaired",
    is_flag=True,
    help="Resample the two runs independently even when they served the same arrivals (by default "
    "such runs, e.g. a replay or a re-run of one seeded benchmark, are resampled in the same time "
    "blocks, which a burst both served cannot blur).",
)
@seed_option("Random seed (bootstrap, test subsampling).")
@json_option
def compare(
    base_run: str,
    cand_run: str,
    db: str,
    lake: Path | None,
    base_db: str | None,
    out_dir: Path | None,
    threshold: float,
    confidence: float,
    resamples: int,
    unpaired: bool,
    seed: int,
    as_json: bool,
) -> None:
    """Compare CAND_RUN against BASE_RUN: every headline statistic with its delta,
    a bootstrap CI of the difference, a Mann-Whitney test per metric.

    \b
    Exit codes: 0 nothing regressed, 1 at least one statistic regressed
    (grew by more than --threshold with its CI above zero, or throughput
    fell by more than --threshold), 2 usage or data error.
    """
    from .. import store
    from ..compare import compare as run_compare
    from ..report.compare_page import comparison_markdown, write_comparison

    if lake is not None:  # both runs from the lake, unless --base-db names the baseline's store
        cand_con = open_source(db, lake, [cand_run] if base_db else [base_run, cand_run])
    else:
        cand_con = store.open_for_reading(db, read_only_if=store.always)
    base_con = (
        store.open_for_reading(base_db, read_only_if=store.always)
        if base_db and (lake is not None or store.db_path(base_db) != store.db_path(db))
        else cand_con
    )
    comp = run_compare(
        base_con, base_run, cand_con, cand_run, threshold, confidence, resamples, seed, paired=not unpaired
    )
    with writing("--out", out_dir or "the comparison folder"):
        html = write_comparison(comp, base_con, cand_con, out_dir)
    for w in comp.warnings:
        echo(f"warning: {w}", err=True)
    if as_json:
        echo(dumps({**comp.to_dict(), "html": str(html)}))
    else:
        echo(comparison_markdown(comp, only_changes=True).rstrip())
        judged = sum(d.verdict != "no verdict" for d in comp.deltas)
        unjudged = len(comp.deltas) - judged
        # a statistic without an interval was looked at, not judged: "33 compared" said more than was checked
        open_ = f" ({judged} judged; {unjudged} without a verdict: too few values to judge)" if unjudged else ""
        echo(f"\n{len(comp.deltas)} statistics compared{open_}; full table and overlaid CDFs: {inline(html)}")
    if comp.exit_code:
        raise CheckFailed(
            f"{cand_run} regressed against {base_run} in {len(comp.regressions)} statistic(s): "
            + ", ".join(f"{d.metric} {d.stat}" for d in comp.regressions)
        )
