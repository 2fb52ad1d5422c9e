"""``tracelat fleet``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import writing
from ..terminal import echo, inline, one_line
from .junit_error import JunitOnUsageError, junit_on_error
from .options import dumps, json_option


@click.command(cls=JunitOnUsageError)
@click.argument("lake", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--runs", "runs_glob", metavar="GLOB", help="Only runs whose id matches this shell pattern.")
@click.option(
    "--ray",
    type=str,
    default=None,
    metavar="local|auto|ADDRESS",
    help="Run the per-run tasks on Ray: local starts a Ray instance here; auto joins $RAY_ADDRESS when "
    "set, else starts one; ADDRESS joins that cluster. Without --ray, or with local/auto where Ray "
    "is not installed, a local process pool does the work (the output says which).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Processes of the local pool, or CPUs of a local Ray instance (default: all CPUs).",
)
@click.option(
    "--slo",
    "slo_path",
    type=click.Path(path_type=Path),
    help="SLO file (as `audit`): checked on every run and over the whole fleet; exit 1 on a violation.",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --slo: also write JUnit XML here (one testsuite per run, one for the fleet).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the fleet page here (index.html), with every run's report under runs/.",
)
@json_option
def fleet(
    lake: Path,
    runs_glob: str | None,
    ray: str | None,
    workers: int | None,
    slo_path: Path | None,
    junit_path: Path | None,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """Analyse every run of a Parquet LAKE at once: fleet percentiles, outliers, SLOs.

    Each run is one task (its summary, model fit, stall rate and tail causes); fleet-wide
    statistics come from merged sketches (percentiles within 1% of exact; mean, std, min,
    max exact); runs whose p99s, t0, bandwidth, stall rate or unexplained tail share stand
    apart (robust z-scores) are flagged and ranked first.  Write a lake with
    `tracelat ingest FILE... --lake DIR` or `tracelat export RUN... --lake DIR`.

    \b
    Exit codes: 0 done (and with --slo, every SLO holds on every run and the
    fleet), 1 an SLO is violated, 2 usage or data error (or an SLO that some run
    cannot evaluate). Such an SLO is an <error> testcase of --junit; any
    other exit 2 rewrites --junit with the error, so CI never shows an earlier
    run's file.
    """
    from ..errors import InputError
    from ..fleet import fleet as run_fleet

    # exit 2 (a bad SLO file, a lake without runs, an --out that cannot be written) rewrites --junit
    # with the error: CI must not show an earlier run's passing file.  An SLO some run cannot
    # evaluate (exit 2 below) is an <error> of the fleet's own file, written here.
    with junit_on_error(junit_path, "fleet"):
        if junit_path is not None and slo_path is None:
            raise InputError("--junit writes the SLO verdicts: pass --slo FILE too")
        spec = None
        if slo_path is not None:
            from ..audit import load_slo

            spec = load_slo(slo_path)
            spec.require_checks()
        out = run_fleet(lake, runs_glob, ray, workers, slo=spec, out=out_dir)
        if junit_path is not None:
            from ..fleet_slo import fleet_junit

            with writing("--junit", junit_path):
                junit_path.parent.mkdir(parents=True, exist_ok=True)
                junit_path.write_bytes(fleet_junit(out["slo"], out["runs"]))
        if out_dir is not None:
            from ..report.fleet_page import write_fleet_page

            with writing("--out", out_dir):
                out["html"] = str(write_fleet_page(out, out_dir))
    code = out["slo"]["exit_code"] if spec is not None else 0
    if as_json:
        echo(dumps(out))
    else:
        _text(out)
    if code:
        sys.exit(code)


def _text(out: dict) -> None:
    f = out["fleet"]
    echo(
        f"fleet of {len(out['runs'])} runs ({out['executor']}); percentiles within "
        f"{out['sketch_relative_error']:.0%} of exact"
    )
    for m, q in f.items():  # the registry's client latencies (pipeline.metrics.LATENCY)
        if q["count"]:
            echo(f"  {m:<8} p50 {q['p50']:.4g}  p90 {q['p90']:.4g}  p99 {q['p99']:.4g}  ({q['count']} values)")

    def n(v, d=4):
        return "-" if v is None else f"{v:.{d}g}"

    slo = out.get("slo")
    # as wide as the longest id (to 64): ids of one fleet often share a long prefix (model, region,
    # replica) and differ at the end, which a cut at a fixed width dropped
    width = min(max([3, *(len(r["run_id"]) for r in out["runs"])]), 64) + 1
    echo(
        f"\n{'run':<{width}}{'p99 TTFT':>10}{'p99 TPOT':>10}{'t0 ms':>8}{'GB/s':>8}{'worst z':>9}"
        + ("  SLO  " if slo else "  ")
        + "flagged"
    )
    for r in out["runs"]:
        verdict = f"  {(r.get('slo') or {}).get('verdict', '-'):<5}" if slo else ""
        echo(
            f"{_short(r['run_id'], width - 1):<{width}}{n(r['ttft_ms']['p99']):>10}{n(r['tpot_ms']['p99']):>10}{n(r['t0_ms']):>8}"
            f"{n(r['effective_bandwidth_gbps']):>8}{n(r['worst_z'], 3):>9}{verdict}  {', '.join(r['outlier']) or '-'}"
        )
    warned = [(r["run_id"], w) for r in out["runs"] for w in r.get("warnings") or []]
    if warned:  # what a run's ingest left in doubt: the table shows such a run only as numbers or "-"
        echo("\nwarnings (see them with `tracelat rejects --lake LAKE`):")
        for run_id, w in warned:
            echo(f"  {inline(run_id)}: {one_line(w)}")
    if slo:
        echo(f"\nSLO over the whole fleet: {slo['fleet']['verdict']}; overall: {slo['verdict']}")
        for c in slo["fleet"]["checks"]:
            echo(f"  {c['status']:<5} {c['message']}")
        for note in slo["fleet"]["not_fleet_wide"]:
            echo(f"  not fleet-wide: {note}")
        gone = (slo["fleet"].get("goodput") or {}).get("runs_without_requests") or []
        if gone:
            echo(f"  goodput over the runs with requests; left out: {', '.join(inline(r) for r in gone)}")
    if out.get("html"):
        echo(f"\nfleet page: {inline(out['html'])}")


def _short(run_id: str, width: int) -> str:
    """``run_id`` in ``width`` characters: its start and its end (where ids of a fleet differ)."""
    if len(run_id) <= width:
        return run_id
    head = (width - 1) // 2
    return run_id[:head] + "\u2026" + run_id[len(run_id) - (width - 1 - head) :]
