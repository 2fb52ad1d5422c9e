"""Ingestors: one module per source format behind one small registry.

Each ingestor has a ``sniff(path, head_text) -> bool`` that recognises its format
from content and a ``convert(path, progress, run_name=...) -> Iterator[Batch]`` that
yields canonical records (``run_name``: the run of records that name none, for
converters that split a file into several runs); :mod:`pipeline.ingest.load`
applies the store rules to all.
"""

from __future__ import annotations

import os
import re

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

from .. import store
from ..errors import InputError, UnknownFormat
from ..escape import not_utf8
from ..terminal import inline
from . import align, canonical, companions, context, reader
from .load import Batch, IngestResult, check_run_id_option, check_zone, default_run_id, ingest_file


@dataclass(frozen=True)
class Ingestor:
    name: str
    description: str
    sniff: Callable[[Path, str], bool]
    convert: Callable[..., Iterator[Batch]]


# Order matters: detection tries them in turn, most specific first.
INGESTORS: dict[str, Ingestor] = {}


def register(ing: Ingestor) -> Ingestor:
    INGESTORS[ing.name] = ing
    return ing


register(
    Ingestor(
        "parquet",
        "canonical records in Parquet (docs/canonical-format.md columns)",
        canonical.sniff_parquet,
        canonical.convert_parquet,
    )
)
register(
    Ingestor(
        "jsonl",
        "canonical JSON Lines, plain/.gz/.zst (docs/canonical-format.md)",
        canonical.sniff_jsonl,
        canonical.convert_jsonl,
    )
)


def _load_plugins() -> None:
    """Engine ingestors register themselves on import (see pipeline/ingest/engines)."""
    from . import engines  # noqa: F401


def detect(path: Path) -> Ingestor:
    """The ingestor whose sniff accepts the file's content."""
    head = "" if canonical.sniff_parquet(path, "") else reader.head_text(path)
    if not head.strip() and not canonical.sniff_parquet(path, ""):
        return INGESTORS["jsonl"]  # empty file: nothing to detect, ingest reads zero lines
    # the canonical formats come first: a canonical file needs no engine module imported
    for loaded in (False, True):
        if loaded:
            _load_plugins()
        for ing in INGESTORS.values():
            if ing.sniff(path, head):
                return ing
    voted = _sniff_later_lines(path, head)
    if voted is not None:
        return voted
    damage = reader.head_damage(path)
    if damage is not None:
        raise InputError(damage)
    raise UnknownFormat(
        f"{path}: unknown format; known formats: {', '.join(INGESTORS)}. "
        "Pass --format NAME to choose one (see `tracelat ingest --help`)",
        path,
    )


# How many non-blank lines detection looks at when the first one is no known format.
SNIFF_LINES = 20


def _sniff_later_lines(path: Path, head: str) -> Ingestor | None:
    """The format most of lines 2..SNIFF_LINES (non-blank) start, when the first line is damaged.

    Sniffers judge the head's first line (line formats) or its start (documents); a
    truncated or garbled first line would make a whole log "unknown format" and, inside a
    directory, silently skipped.  Each later line is asked in its place; a format wins
    with more than half of them, so a README quoting one JSON line is still no trace, and
    the damaged line then becomes a reject like any other.
    """
    lines = head.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.strip()][1:SNIFF_LINES]
    votes: dict[str, int] = {}
    for i in starts:
        rest = "".join(lines[i:])
        name = next((ing.name for ing in INGESTORS.values() if ing.name != "parquet" and ing.sniff(path, rest)), None)
        if name:
            votes[name] = votes.get(name, 0) + 1
    if not votes:
        return None
    best = max(votes, key=lambda n: votes[n])  # ties: the first registered (most specific)
    return INGESTORS[best] if 2 * votes[best] > len(starts) else None


def get(name: str) -> Ingestor:
    if name not in INGESTORS:
        _load_plugins()
    if name not in INGESTORS:
        raise InputError(f"unknown format {name!r}; known formats: {', '.join(INGESTORS)}")
    return INGESTORS[name]


def expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """``(file, found_in_a_directory)`` for files named and every non-hidden file under
    directories named, in sorted order; a file reached twice (named twice, or named and in a
    directory named) comes once, where it was first reached: twice, its name collided with
    itself and the run took its folders' names."""
    out = _expand(paths)
    seen: set[Path] = set()
    unique = []
    for f, in_dir in out:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append((f, in_dir))
    return unique


def _expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    out: list[tuple[Path, bool]] = []
    for p in paths:
        if p.is_dir():
            files = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(s.startswith(".") for s in f.relative_to(p).parts) and not _sim_truth(f)
            )
            if not files:
                raise InputError(f"{p}: directory holds no files to ingest")
            out.extend((f, True) for f in files)
        else:
            reader.check_file(p)
            out.append((p, False))
    return out


def _without_the_store(con, files: list[tuple[Path, bool]]) -> list[tuple[Path, bool]]:
    """``files`` less the store being written and its DuckDB companions (write-ahead log, spill
    folder), when a folder being ingested holds them (``ingest logs/ --db logs/t.duckdb``): they
    are no trace, and each was a "no known format" that failed the command. Named alone, a file
    is still read (and refused) as the user asked."""
    if not any(in_dir for _, in_dir in files):
        return files
    own = store.scalar(con, "select path from duckdb_databases() where database_name = current_database()")
    if not own:  # an in-memory store
        return files
    real = os.path.realpath(own)
    return [
        (f, in_dir)
        for f, in_dir in files
        if not in_dir
        or (r := os.path.realpath(f)) not in (real, real + ".wal")
        and not r.startswith(real + ".tmp" + os.sep)
    ]


def _sim_truth(f: Path) -> bool:
    """Whether ``f`` is the ground-truth file `tracelat simulate` writes beside its trace (no trace:
    a folder of simulated runs is ingested without it, as the trace alone would be)."""
    if not f.name.endswith(".truth.json"):
        return False
    try:
        with open(f, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return re.search(rb'"engine"\s*:\s*"tracelat-sim"', head) is not None


# formats whose records may name their run (a run record): the others take the file's name
CANONICAL = ("jsonl", "parquet")


def _detected(path: Path, fmt: str | None) -> tuple[Ingestor | None, InputError | None]:
    """The file's ingestor (``fmt``'s, or detected), or why there is none."""
    try:
        return (get(fmt) if fmt else detect(path)), None
    except InputError as exc:
        return None, exc


def _refuse_implicit_join(con, path: Path, name: str, this_command: set[Path]) -> None:
    """Refuse a file whose run would take its name from the file (no --run-id) when an earlier
    ingest of another file made that run: every AIPerf export is a profile_export.jsonl, and a
    second one merged into the first's run, its numbers wrong, with nothing said.  Files of this
    command are told apart beforehand (:func:`_distinct_run_names`)."""
    held = con.execute(
        "select distinct path from ingests where list_contains(run_ids, $r) order by 1", {"r": name}
    ).fetchall()
    others = [h for (h,) in held if Path(h).resolve() not in this_command]
    if others:
        raise InputError(
            f"{path}: its run would be named {name!r} after the file, and run {name!r} already holds "
            f"{others[0]}{f' (and {len(others) - 1} more)' if len(others) > 1 else ''} from an earlier "
            f"ingest: pass --run-id {name} to add this file to that run (say, a server log and the "
            "client's records of one run), or --run-id NAME for a run of its own"
        )


def _distinct_run_names(files: list[Path]) -> dict[Path, str]:
    """Run names for files whose file names collide (``a/profile_export.jsonl`` and
    ``b/profile_export.jsonl``): qualify them with their folder, ``a/profile_export``,
    so that one ingest never merges unrelated runs by accident.

    When the folders share a name too (``x/vllm/requests.jsonl``, ``y/vllm/requests.jsonl``)
    more of the path is used, as many folders as it takes: ``x/vllm/requests``.

    Files of one folder that share a name (``server.log`` and its rotated ``server.log.1``)
    are parts of one run: they keep that name together.
    """
    by_name: dict[str, list[Path]] = {}
    for f in files:
        by_name.setdefault(default_run_id(f), []).append(f)
    out: dict[Path, str] = {}
    for name, fs in by_name.items():
        folders = sorted({f.resolve().parent.parts for f in fs})
        if len(folders) < 2:
            continue
        # a name that is its folder's already (an LLMServingSim bench folder) starts from the folder above
        folders_above = [p[:-1] if p and p[-1] == name else p for p in folders]
        for depth in range(1, max(len(p) for p in folders_above) + 1):
            names = ["/".join((*p[-depth:], name)).lstrip("/") for p in folders_above]
            if len(set(names)) == len(names):
                break
        of_folder = dict(zip(folders, names))
        out.update((f, of_folder[f.resolve().parent.parts]) for f in fs)
    return out


def run_names(files: list[Path]) -> dict[Path, str]:
    """The run ``tracelat ingest FILES`` (no --run-id) gives each file's records that name none:
    the file name (:func:`.load.default_run_id`), with its folders when two files share it
    (:func:`_distinct_run_names`)."""
    distinct = _distinct_run_names(files)
    return {f: distinct.get(f, default_run_id(f)) for f in files}


# Steps run after files were ingested, with the run ids they touched, each in its own
# transaction: e.g. estimating context_tokens from request timelines (engine ingestors).
PostIngest = Callable[["duckdb.DuckDBPyConnection", list[str]], None]
POST_INGEST: list[PostIngest] = [context.estimate_context]


def ingest_paths(
    con, paths, fmt=None, run_id=None, replace=False, progress_for=None, clock_offsets=(), tz=None
) -> list[IngestResult]:
    """Ingest files (directories expanded), each in its own transaction.

    ``clock_offsets``: ``SOURCE=SECONDS`` items (``--clock-offset``) that put a file's
    times on its run's reference clock instead of estimating the offset
    (:mod:`pipeline.ingest.align`).  ``tz``: the zone of local wall-clock stamps in
    server logs (default: this machine's zone; the run states which was used).

    ``progress_for(path)`` may return a context manager yielding a callable that
    receives byte counts (the CLI uses a click progress bar).  When a file fails,
    the files before it stay ingested (and get their post-ingest steps); the error
    says which they were.
    """
    if run_id is not None:  # the option, not the names given to files whose names collide
        check_run_id_option(run_id)
    if tz is not None:
        check_zone(tz)
    results: list[IngestResult] = []
    files = _without_the_store(con, expand(Path(p) for p in paths))
    overrides = align.parse_offsets(tuple(clock_offsets), [str(f) for f, _ in files]) if clock_offsets else {}
    beside = {path: c for path, _ in files if (c := _companion(path)) is not None}
    found = {path: _detected(path, fmt) for path, _ in files if path not in beside}
    this_command = {f.resolve() for f, _ in files}
    # names from the files that will be read: a skipped meta.yaml must not make meta.json's run longer
    run_names = _distinct_run_names([f for f in found if found[f][0] is not None]) if run_id is None else {}
    at = 0
    try:
        for at, (path, in_dir) in enumerate(files):
            if path in beside:  # written by the benchmark beside the records that are read
                results.append(IngestResult(str(path), "?", status="skipped", note=companions.note(beside[path])))
                results[-1].companion = True
                continue
            ing, problem = found[path]
            if ing is None:
                if not in_dir or fmt:
                    raise problem
                # a README or config file next to the logs: say so, do not stop the directory
                if isinstance(problem, UnknownFormat):
                    results.append(IngestResult(str(path), "?", status="skipped", note="no known format"))
                else:  # damaged or unreadable (a cut-off .gz): what detection found, not "no known format"
                    shown = not_utf8(path) or str(path)  # a name that is not UTF-8: as its bytes
                    why = str(problem).removeprefix(f"{shown}: ")
                    results.append(
                        IngestResult(shown, "?", status="skipped", note=why, hint="or remove it from the folder")
                    )
                continue
            name = run_id or run_names.get(path)
            if run_id is None and ing.name not in CANONICAL:
                _refuse_implicit_join(con, path, name or default_run_id(path), this_command)
            if progress_for is None:
                results.append(ingest_file(con, path, ing.name, ing.convert, name, replace, tz=tz))
            else:
                with progress_for(path) as progress:
                    results.append(ingest_file(con, path, ing.name, ing.convert, name, replace, progress, tz=tz))
            _note_unused_options(con, results[-1], run_id, tz)
    except InputError as exc:
        done = [r for r in results if r.status not in ("unchanged", "skipped")]
        _post_ingest(con, done, {p: o for p, o in overrides.items() if p in {r.path for r in results}})
        said = []
        if done:
            kept = ", ".join(r.path for r in done[:5]) + (" ..." if len(done) > 5 else "")
            said.append(f"the {len(done)} file(s) before it were ingested and kept: {kept}")
        unread = [str(f) for f, _ in files[at + 1 :]]
        # for `ingest --json`: the file that stopped the command and those it left unread
        exc.failed_path, exc.unread, exc.results = str(files[at][0]), unread, results
        if unread:
            rest = ", ".join(unread[:5]) + (" ..." if len(unread) > 5 else "")
            said.append(f"the {len(unread)} file(s) after it were not read: {rest}")
        if not said:
            raise
        after = "; ".join(said)
        if isinstance(exc, UnknownFormat):  # what the file is can still be said (commands.ingest)
            err: InputError = UnknownFormat(str(exc), exc.path, after)
        else:
            err = InputError(f"{exc} ({after})")
        err.results = results  # what loaded before it: the command still prints their lines
        err.failed_path, err.unread = exc.failed_path, unread
        raise err from exc
    _post_ingest(con, results, overrides)
    if results and all(r.companion for r in results):
        raise InputError("nothing to ingest: " + "; ".join(f"{r.path}: {r.note}" for r in results))
    return results


def _companion(path: Path) -> companions.Companion | None:
    """The benchmark's companion file ``path`` is, if it is one (:mod:`.companions`)."""
    if not any(path.name in c.names for c in companions.COMPANIONS):
        return None
    try:
        return companions.companion(path, reader.head_text(path))
    except InputError:  # unreadable: detection says what is wrong with it
        return None


def _note_unused_options(con, r: IngestResult, run_id: str | None, tz: str | None) -> None:
    """Say when --tz or --run-id did nothing for a file, which the user would otherwise take for done."""
    if r.status == "unchanged" and tz:
        # the zone the stored ingest read the file's wall-clock stamps in (none: the file has no such stamps)
        read_in = store.scalar(
            con,
            "select any_value(json_extract_string(r.meta, '$.timestamps_time_zone')) from run_records r "
            "join ingests i using (ingest_id) where i.path = ? and r.meta is not null",
            [r.stored_as or r.path],
        )
        if read_in is not None and read_in.split(" ", 1)[0] != tz:
            r.notes.append(
                f"--tz {tz} not applied: this content was ingested before, its stamps read in {read_in}; add "
                "--replace to read them again in this zone"
            )
    if r.status == "ingested" and r.run_ids:
        _note_same_content(con, r)
    if run_id and r.status != "unchanged" and r.run_ids and run_id not in r.run_ids:
        r.notes.append(
            f"--run-id {run_id} not used: the file's records name their own run ({_some(r.run_ids)}); --run-id names "
            "only records that name none"
        )


def _note_same_content(con, r: IngestResult) -> None:
    """Say when the bytes just loaded were loaded before under another run name (a copy of a file
    under another name, or another --run-id): they are now two runs of the same records, which
    every fleet, compare or nightly figure would count twice."""
    other = con.execute(
        "select o.path, o.run_ids from ingests o join ingests i on o.sha256 = i.sha256 and o.ingest_id < i.ingest_id "
        "where i.ingest_id = (select max(ingest_id) from ingests where path = ?) and o.run_ids <> i.run_ids "
        "order by o.ingest_id limit 1",
        [r.path],
    ).fetchall()
    if other:
        path, runs = other[0]
        r.notes.append(
            f"the same content was ingested before from {inline(path)} as run {_some(runs or [])}: its records "
            f"are now stored twice, also as run {_some(r.run_ids)} (a fleet of this store counts them twice)"
        )


def _some(run_ids: list[str]) -> str:
    """The first three run ids, each on one line, and "..." when there are more."""
    return ", ".join(inline(x) for x in run_ids[:3]) + (" ..." if len(run_ids) > 3 else "")


def loaded_nothing(results: list[IngestResult]) -> list[IngestResult]:
    """The files that loaded nothing: skipped (no known format, in a directory), every line
    rejected, or no records in them.  A file whose content was ingested before (``unchanged``)
    loaded it then, unless that ingest too loaded nothing (it holds no run): an empty file is as
    empty the second time.  ``tracelat ingest`` and ``tracelat nightly`` both fail on these (exit 2):
    a file that looks like a trace and holds nothing usable must not pass unnoticed."""
    return [
        r
        for r in results
        if not r.companion
        and (r.status == "skipped" or (not r.held_runs if r.status == "unchanged" else not r.accepted))
    ]


def why_nothing(r: IngestResult, rejects: str = "") -> str:
    """Why ``r`` (one of :func:`loaded_nothing`) loaded nothing; ``rejects`` follows the count of
    rejected records (where to see them, or the first one's reason)."""
    if r.status == "skipped":
        return f"skipped: {r.note}; {r.hint or 'name its format with --format NAME'}"
    if r.status == "unchanged":
        return f"it loaded nothing when this content was ingested before{r.note} (no records, or all rejected)"
    if r.rejected:
        return f"all {r.rejected} records rejected{rejects}"
    return "no records in it" if not r.lines_read else f"no {r.format} records in it"


def _post_ingest(con, results: list[IngestResult], overrides: dict[str, float] | None = None) -> None:
    changed = [res for res in results if res.status not in ("unchanged", "skipped")]
    touched = {r for res in changed for r in (*res.run_ids, *res.removed_runs)}
    reloaded = {res.path: [*res.run_ids, *res.removed_runs] for res in changed}
    if overrides or reloaded:
        # offsets belong to the runs the file holds after this command: an offset given for a file
        # already ingested (unchanged, maybe from another path) re-aligns its runs
        by_path = {res.path: res for res in results}
        stored = {(by_path[p].stored_as or p) if p in by_path else p: p for p in overrides or {}}
        # the runs this command loaded the file into (or found it in): another run that holds
        # the same path keeps its own alignment
        runs_of = {
            s: (by_path[p].held_runs if by_path[p].status == "unchanged" else by_path[p].run_ids)
            for s, p in stored.items()
            if p in by_path
        }
        with store.transaction(con):
            realign, applied = align.set_overrides(con, {s: overrides[p] for s, p in stored.items()}, reloaded, runs_of)
        touched.update(realign)
        for path, runs in applied.items():
            res = by_path.get(stored[path])
            if res is None:
                continue
            if not runs:
                res.notes.append("--clock-offset not applied: the file holds no run (it loaded no records)")
            elif res.status == "unchanged":  # its runs are aligned again: the ingest output says how
                res.run_ids = runs
    touched = sorted(touched)
    if not touched:
        return
    # clocks first: every later step (context estimation) needs one clock per run
    for step in (align.align_clocks, *POST_INGEST):
        with store.transaction(con):
            step(con, touched)
            store.bump_generation(con, touched)


__all__ = [
    "POST_INGEST",
    "loaded_nothing",
    "why_nothing",
    "INGESTORS",
    "Ingestor",
    "register",
    "detect",
    "get",
    "ingest_paths",
    "Batch",
    "IngestResult",
]
