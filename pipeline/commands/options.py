"""Click options shared by several commands."""

from __future__ import annotations

from pathlib import Path

import click

from ..jsonplain import dumps  # noqa: F401  (re-exported for the commands)

db_option = click.option(
    "--db",
    envvar="TRACELAT_DB",
    default="tracelat.duckdb",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="DuckDB store file (also $TRACELAT_DB).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


def seed_option(help: str):  # noqa: A002
    """``--seed`` (default 0): NumPy's generators take no negative seed, so click refuses one."""
    return click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help=help)


lake_option = click.option(
    "--lake",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Read the run(s) from this Parquet lake instead of --db (derived tables and fits computed in memory).",
)


def reject_both(lake: Path | None) -> None:
    """--lake replaces --db: naming both on the command line is a mistake, not a choice."""
    if lake is None:
        return
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("db") == click.core.ParameterSource.COMMANDLINE:
        from ..errors import InputError

        raise InputError("--db and --lake name two sources; pass one")


def open_source(
    db: str, lake: Path | None, run_ids: list[str] | None, read_only_if=None, tables: tuple[str, ...] | None = None
):
    """The store to read: ``--db`` (as :func:`pipeline.store.open_for_reading`), or an in-memory
    store of ``run_ids`` (None: every run) built from ``--lake`` (only ``tables`` of it, when given)."""
    from .. import store

    if lake is None:
        return store.open_for_reading(db, read_only_if=read_only_if)
    from ..lake import lake_runs, open_runs, part_name

    reject_both(lake)
    runs_dir = Path(lake) / "runs"
    # the in-memory store holds only the runs asked for: on a miss, name the lake's own (listing
    # them reads every run's file, so only when some asked run has no folder)
    if run_ids is not None and not all((runs_dir / part_name(r)).is_dir() for r in run_ids):
        have = lake_runs(lake)
        missing = [r for r in run_ids if r not in set(have)]
        if have and missing:
            import shlex

            raise store.unknown_run(missing[0], have, f"lake {lake}", f"tracelat runs --lake {shlex.quote(str(lake))}")
    return open_runs(lake, run_ids, tables)
