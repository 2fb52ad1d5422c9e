"""``tracelat fleet``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo
from .options import dumps, json_option


@click.command()
@click.argument("lake", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--runs", "runs_glob", metavar="GLOB", help="Only runs whose id matches this shell pattern.")
@click.option("--ray", type=str, default=None, metavar="local|auto|ADDRESS",
              help="Run the per-run tasks on Ray (local: start one here; auto: $RAY_ADDRESS, else local). "
                   "Without it, or without Ray installed, a local process pool does the work.")
@click.option("--workers", type=click.IntRange(min=1), help="Processes of the local pool (default: CPUs).")
@json_option
def fleet(lake: Path, runs_glob: str | None, ray: str | None, workers: int | None, as_json: bool) -> None:
    """Analyse every run of a Parquet LAKE at once: fleet percentiles and outliers.

    Each run is one task (its summary, model fit, stall rate and tail causes); fleet-wide
    TTFT/TPOT/E2E/ITL percentiles come from merged sketches (relative error 1%); runs
    whose p99s, t0, bandwidth or stall rate stand apart (robust z-scores) are flagged.
    Write a lake with `tracelat export RUN... --lake DIR`.
    """
    from ..fleet import fleet as run_fleet

    out = run_fleet(lake, runs_glob, ray, workers)
    if as_json:
        echo(dumps(out))
        return
    f = out["fleet"]
    echo(f"fleet of {len(out['runs'])} runs ({out['executor']}); percentiles within "
         f"{out['sketch_relative_error']:.0%} of exact")
    for m, q in f.items():  # the registry's client latencies (pipeline.metrics.LATENCY)
        if q["count"]:
            echo(f"  {m:<8} p50 {q['p50']:.4g}  p90 {q['p90']:.4g}  p99 {q['p99']:.4g}  ({q['count']} values)")
    echo(f"\n{'run':<32}{'p99 TTFT':>10}{'p99 TPOT':>10}{'t0 ms':>8}{'GB/s':>8}{'worst z':>9}  flagged")
    for r in out["runs"]:
        def n(v, d=4):
            return "-" if v is None else f"{v:.{d}g}"
        echo(f"{r['run_id'][:31]:<32}{n(r['ttft_ms']['p99']):>10}{n(r['tpot_ms']['p99']):>10}{n(r['t0_ms']):>8}"
             f"{n(r['effective_bandwidth_gbps']):>8}{n(r['worst_z'], 3):>9}  {', '.join(r['outlier']) or '-'}")
