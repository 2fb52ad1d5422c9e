"""``tracelat export``."""

from __future__ import annotations

from pathlib import Path

import click

from ..terminal import echo
from .options import db_option, dumps, json_option


@click.command()
@click.argument("run_id")
@db_option
@click.option("--perfetto", "perfetto", type=click.Path(path_type=Path), required=True, metavar="FILE.json[.gz]",
              help="Write the run as a Chrome/Perfetto trace (Trace Event Format): steps, requests with their "
                   "queue/prefill/decode phases, stalls, KV and queue counters. Open it at ui.perfetto.dev.")
@click.option("--max-steps", type=click.IntRange(min=1000), default=200_000, show_default=True,
              help="Above this many steps, keep every spike and stall and an even sample of the rest.")
@json_option
def export(run_id: str, db: str, perfetto: Path, max_steps: int, as_json: bool) -> None:
    """Export RUN_ID for another tool (today: a Perfetto timeline)."""
    from .. import store
    from ..errors import InputError
    from ..export.perfetto import export as to_perfetto
    from ..fit import get_or_fit

    con = store.connect(db, must_exist=True)
    store.build_derived(con)
    store.require_run(con, run_id)
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
    echo(f"{info['path']}: {info['steps']} steps ({info['step_sampling']}), {info['requests']} requests, "
         f"{info['stalls']} stalls, {info['bytes'] / 2**20:.1f} MiB; open it at https://ui.perfetto.dev")
