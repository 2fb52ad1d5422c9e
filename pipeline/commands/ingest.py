"""``tracelat ingest``."""

from __future__ import annotations

import shlex

import contextlib
import inspect
import sys
from pathlib import Path

import click

from ..errors import UnknownFormat
from ..terminal import clean, echo, inline, one_line
from .options import db_option, dumps, json_option

BIG_FILE = 8 << 20


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@db_option
@click.option(
    "--run-id",
    help="Run id for records that name none (default: the file name up to its first dot; "
    "with the folder in front when two files of one ingest share a name).",
)
@click.option("--format", "fmt", help="Skip detection and use this format (see the list above).")
@click.option("--replace", is_flag=True, help="Re-load files whose content (or path) was ingested before.")
@click.option(
    "--clock-offset",
    "clock_offsets",
    multiple=True,
    metavar="SOURCE=SECONDS",
    help="Put file SOURCE (a path or file name given here) on its run's step clock by adding SECONDS "
    "to its times as stored, instead of estimating the offset. A vLLM bench JSON's times count from "
    "its first request (meta.perf_counter_origin_s): add that to an offset measured against "
    "perf_counter. Repeatable.",
)
@click.option(
    "--tz",
    default=None,
    metavar="ZONE",
    help="Time zone of local wall-clock stamps in server logs (e.g. Europe/Berlin; default: this "
    "machine's zone, stated in the run's metadata).",
)
@click.option(
    "--lake",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write into this Parquet lake (DIR/<table>/run_id=<id>/) instead of the store: the same "
    "rules, through a temporary store; see docs/scale.md.",
)
@json_option
def ingest(
    paths: tuple[Path, ...],
    db: str,
    run_id: str | None,
    fmt: str | None,
    replace: bool,
    clock_offsets: tuple[str, ...],
    tz: str | None,
    lake: Path | None,
    as_json: bool,
) -> None:
    """Load trace files into the store, one transaction per file.

    PATHS are files or directories (every file below a directory is ingested,
    each with the format detected from its content).  A bad line never stops a
    file: it is recorded in the `rejects` table with its line number and reason.
    Identical content is not loaded twice; --replace re-loads it.

    Several files of one run (e.g. a vLLM server log and the `vllm bench serve`
    JSON, ingested with one --run-id) may be on different clocks: the request
    records are aligned to the steps' clock from the data (offset, uncertainty
    and match rate are printed), and scheduling times the client cannot see are
    inferred from the steps. See docs/incidents.md.
    """
    from .. import ingest as ing
    from .. import store

    from .options import reject_both

    reject_both(lake)
    # `where` ends commands to paste into a shell: quoted

    where = f"--lake {shlex.quote(str(lake))}" if lake is not None else f"--db {shlex.quote(str(db))}"

    @contextlib.contextmanager
    def progress_for(path: Path):
        size = path.stat().st_size
        if as_json or size < BIG_FILE:
            yield None
            return
        with click.progressbar(length=size, label=clean(f"ingest {path.name}"), file=sys.stderr) as bar:
            yield bar.update

    kwargs = dict(
        fmt=fmt, run_id=run_id, replace=replace, progress_for=progress_for, clock_offsets=clock_offsets, tz=tz
    )
    try:
        if lake is not None:
            from ..lake_ingest import ingest_to_lake

            try:
                results, _, con = ingest_to_lake(lake, paths, **kwargs)
            except Exception as exc:
                _say_kept_and_close(getattr(exc, "lake_store", None), exc, as_json, where)
                raise
        else:
            con = store.connect(db)
            try:
                results = ing.ingest_paths(con, paths, **kwargs)
                store.build_derived(con)
            except BaseException as exc:
                _say_kept_and_close(con, exc, as_json, where)
                raise
    except UnknownFormat as exc:
        _workload_instead(exc)
        raise
    _name_workloads(results)
    from ..ingest.align import describe

    touched = sorted({r for res in results for r in res.run_ids})
    aligned = describe(con, touched)
    if as_json:
        placed = _alignments(con, touched)
        echo(dumps([r.__dict__ | {"clock_alignment": placed.get(r.stored_as or r.path, [])} for r in results]))
        for problem, text in aligned:
            if problem:
                echo(f"warning: {one_line(text)}", err=True)
        for r in results:
            for text in r.conflicts:
                echo(f"warning: {inline(r.path)}: {one_line(text)}", err=True)
        _fail_if_nothing_loaded(results, where)
        return
    _print_lines(con, results, where, aligned)
    _fail_if_nothing_loaded(results, where)


def _say_kept_and_close(con, exc: BaseException, as_json: bool, where: str) -> None:
    """A file that stops the command: the files loaded before it were kept, and what they loaded (and
    how their clocks were put together) is said before the error. The store is closed whatever
    happens: an error's traceback keeps the caller's frame, and with it the store open, alive, and a
    caller in the same process (tests, the fuzzer) could not open the store again."""
    try:
        if as_json:
            _json_of_stopped(con, exc)
        elif con is not None and getattr(exc, "results", None):
            _print_lines(con, exc.results, where)
    finally:
        if con is not None:
            con.close()


def _json_of_stopped(con, exc: BaseException) -> None:
    """``--json`` when a file stops the command (exit 2): the same list as after a whole ingest, each
    file read before it, then the failing file (``status: error`` with the message) and the files
    not read (``status: not read``), so a script sees what is in the store without parsing stderr."""
    from ..errors import InputError

    failed = getattr(exc, "failed_path", None)
    if not isinstance(exc, InputError) or failed is None:
        return  # not a file's error (an option, an interrupt, a bug): stderr says it
    results = getattr(exc, "results", None) or []
    placed = {}
    if con is not None and results:
        placed = _alignments(con, sorted({r for res in results for r in res.run_ids}))
    entries = [r.__dict__ | {"clock_alignment": placed.get(r.stored_as or r.path, [])} for r in results]
    entries.append({"path": failed, "status": "error", "error": str(exc)})
    entries += [{"path": p, "status": "not read"} for p in getattr(exc, "unread", [])]
    echo(dumps(entries))


def _print_lines(con, results, where: str, aligned: list | None = None) -> None:
    """Each file's line, notes and conflicts, then each aligned source's line, then the rejects."""
    if aligned is None:
        from ..ingest.align import describe

        aligned = describe(con, sorted({r for res in results for r in res.run_ids}))
    for r in results:
        echo(r.line())
        for text in r.notes:
            echo(f"  {one_line(text)}")
        for text in r.conflicts:
            echo(f"warning: {inline(r.path)}: {one_line(text)}", err=True)
    for problem, text in aligned:
        echo(f"warning: {one_line(text)}" if problem else one_line(text), err=problem)
    rejected = sum(r.rejected for r in results)
    if rejected:
        echo(f"{rejected} lines rejected; see them with: tracelat rejects [FILE] {where}", err=True)


def _alignments(con, run_ids: list[str]) -> dict[str, list[dict]]:
    """Per file path, how each run put it on its steps' clock (the run's meta.clock_alignment source
    entries: status, offset_s, uncertainty_ms, match shares, re-timing, the reason of a failure), with
    the run and its reference files: what the text lines say, for scripts that gate on it."""
    import json

    rows = con.execute(
        "select run_id, json_extract(meta, '$.clock_alignment') from runs where run_id = any($r) "
        "and json_extract(meta, '$.clock_alignment') is not null order by run_id",
        {"r": run_ids},
    ).fetchall()
    out: dict[str, list[dict]] = {}
    for run_id, text in rows:
        info = json.loads(text)
        for src in info.get("sources") or []:
            entry = {"run_id": run_id, "reference": info.get("reference"), **src}
            out.setdefault(src.get("path"), []).append(entry)
    return out


def _fail_if_nothing_loaded(results, where: str) -> None:
    """Exit 2 (a data error) when a file loaded nothing: skipped, every line rejected, or
    no records in it.  The files that did load stay loaded; the last line says which did not,
    so a directory ingest that silently dropped a file cannot pass a script's `&&`."""
    from ..errors import InputError
    from ..ingest import loaded_nothing, why_nothing

    empty = loaded_nothing(results)
    if not empty:
        return

    def why(r) -> str:
        return why_nothing(r, f"; see them with: tracelat rejects {shlex.quote(r.path)} {where}")

    shown = "; ".join(f"{clean(r.path)} ({why(r)})" for r in empty[:5]) + (" ..." if len(empty) > 5 else "")
    loaded = len(results) - len(empty)
    kept = f"; the other {loaded} file(s) were ingested" if loaded else ""
    raise InputError(f"{len(empty)} of {len(results)} file(s) loaded nothing: {shown}{kept}")


def _formats_help() -> str:
    # the static list, not the ingestor registry: importing the ingestors takes ~0.4 s
    from ..formats import FORMATS

    width = max(len(name) for name, _ in FORMATS) + 2
    return "\n".join(f"  {name:<{width}}{description}" for name, description in FORMATS)


ingest.help = inspect.cleandoc(ingest.help or "") + "\n\n\b\nFormats (--format NAME):\n" + _formats_help()


def _workload_instead(exc: UnknownFormat) -> None:
    """A workload trace named on its own (Mooncake, Azure) is no format either: say what it is for."""
    import shlex

    from ..sim.workload import looks_like_workload

    if exc.path is not None and looks_like_workload(Path(exc.path)):
        raise UnknownFormat(
            f"{exc.path}: a workload trace (arrivals and sizes, no latencies to analyse), not a format to "
            f"ingest; replay a run on it with `tracelat replay RUN --workload {shlex.quote(str(exc.path))}`",
            exc.path,
            exc.after,
        ) from exc


def _name_workloads(results) -> None:
    """A skipped file that is a workload trace (Mooncake, Azure: arrivals and sizes, no latencies)
    is no format to name: say what it is for instead."""
    if not any(r.status == "skipped" and not r.companion for r in results):
        return  # the simulator's module (NumPy) stays out of every other ingest's start
    import shlex

    from ..sim.workload import looks_like_workload

    for r in results:
        if r.status == "skipped" and not r.companion and looks_like_workload(Path(r.path)):
            r.note = "a workload trace: arrivals and sizes, no latencies to analyse"
            r.hint = f"replay a run on it with `tracelat replay RUN --workload {shlex.quote(r.path)}`"
