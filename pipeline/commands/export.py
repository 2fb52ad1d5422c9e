"""``tracelat export``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo, inline, shown_id
from .options import db_option, dumps, json_option


@click.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN...")
@db_option
@click.option(
    "--lake",
    type=click.Path(file_okay=False, path_type=Path),
    help="Copy the runs into this Parquet lake (DIR/<table>/run_id=<id>/), for `tracelat fleet`; "
    "with --perfetto or --llm-d, read the run from this lake instead of --db.",
)
@click.option(
    "--perfetto",
    "perfetto",
    type=click.Path(path_type=Path),
    metavar="FILE.json[.gz]",
    help="Write the run as a Chrome/Perfetto trace (Trace Event Format): steps, requests with their "
    "queue/prefill/decode phases, stalls, KV and queue counters. Open it at ui.perfetto.dev.",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1000),
    default=200_000,
    show_default=True,
    help="Above this many steps, keep every spike and stall and an even sample of the rest.",
)
@click.option(
    "--llm-d",
    "llmd",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.json",
    help="Write the run as an llm-d Benchmark Report v0.2.1 (request counts, TTFT/TPOT/ITL/latency "
    "statistics, token and request rates, engine KV and queue statistics).",
)
@json_option
def export(
    run_ids: tuple[str, ...],
    db: str,
    lake: Path | None,
    perfetto: Path | None,
    max_steps: int,
    llmd: Path | None,
    as_json: bool,
) -> None:
    """Export runs for other tools: a Perfetto timeline or an llm-d benchmark report (one run), or a
    Parquet lake (any number)."""
    from .. import store
    from ..errors import InputError

    targets = [x for x in (perfetto, llmd) if x is not None]
    if len(targets) > 1 or (not targets and lake is None):
        raise InputError(
            "say where to, once: --perfetto FILE or --llm-d FILE (one run), or --lake DIR "
            "(with --perfetto or --llm-d, --lake is where the run is read from)"
        )
    ctx = click.get_current_context()
    if perfetto is None and ctx.get_parameter_source("max_steps") != click.core.ParameterSource.DEFAULT:
        raise InputError(
            f"--max-steps samples the steps of a Perfetto trace; {'--llm-d' if llmd is not None else '--lake'} "
            "keeps every step: drop --max-steps, or write the trace with --perfetto FILE"
        )
    if targets and lake is not None:  # the lake is the source
        from .options import open_source

        con = open_source(db, lake, list(run_ids))
    else:
        con = store.connect(db, must_exist=True)
        store.build_derived(con)
    for r in run_ids:
        store.require_run(con, r)
    if not targets:
        from ..lake import export_runs, lake_runs

        held = sorted(set(run_ids) & set(lake_runs(lake))) if Path(lake).exists() else []
        rows = export_runs(con, list(run_ids), lake)
        n_runs = len(set(run_ids))
        echo(
            dumps(rows)
            if as_json
            else f"{lake}: {n_runs} run{'' if n_runs == 1 else 's'}: "
            + ", ".join(f"{n} {t}" for t, n in rows.items() if t != "runs")
        )
        if held:  # the lake's rows of a run are replaced whole: say so, it may have been another run's
            echo(
                f"replaced in {lake}: {', '.join(shown_id(r) for r in held)} (what the lake held of "
                f"{'it' if len(held) == 1 else 'them'} is gone)",
                err=True,
            )
        return
    if len(run_ids) != 1:
        raise InputError(f"--{'perfetto' if perfetto is not None else 'llm-d'} writes one run; name one")
    run_id = run_ids[0]
    if llmd is not None:
        from ..export.llmd import export as to_llmd

        try:
            info = to_llmd(con, run_id, llmd)
        except OSError as exc:
            raise InputError(f"cannot write {llmd}: {exc.strerror or exc}") from exc
        echo(
            dumps(info)
            if as_json
            else f"{info['path']}: llm-d Benchmark Report v{info['version']}, "
            f"{info['requests']} requests, latency: {', '.join(info['latency']) or 'none (no request records)'}"
        )
        return
    from ..export.perfetto import export as to_perfetto
    from ..fit import get_or_fit

    get_or_fit(con, run_id)  # spike causes and residuals on the steps, when the run can be fitted
    try:
        info = to_perfetto(con, run_id, perfetto, max_steps)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    except OSError as exc:
        raise InputError(f"cannot write {perfetto}: {exc.strerror or exc}") from exc
    if as_json:
        echo(dumps(info))
        return
    drawn = [
        f"{info['steps_overlapping_the_one_before']} drawn from the end of the step before them (they overlap it)"
        if info["steps_overlapping_the_one_before"]
        else "",
        f"{info['steps_without_times']} left out (no time stamps)" if info["steps_without_times"] else "",
    ]
    notes = "; ".join(x for x in drawn if x)
    echo(
        f"{inline(info['path'])}: {info['steps']} steps ({info['step_sampling']}{'; ' + notes if notes else ''}), "
        f"{info['requests']} requests, "
        f"{info['stalls']} stalls, {info['bytes'] / 2**20:.1f} MiB; open it at https://ui.perfetto.dev"
    )
