"""Loading batches of canonical records into the store, with every ingest rule of docs/canonical-format.md.

Every ingestor, canonical or engine-specific, produces :class:`Batch` objects of
canonical JSON text; this module is the only writer of the base tables.  One file
is one transaction: :func:`ingest_file` rolls back everything on any failure.
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from ..errors import InputError, TracelatError
from .. import store
from ..store import arrow, scalar
from ..terminal import UNSAFE_IN_ID, shown_id
from . import reader
from .canonical_sql import FIELDS, stage_sql
from .typed_sql import typed_stage_sql

if TYPE_CHECKING:  # Arrow loads only where a batch brings Arrow data (not the canonical fast path)
    import pyarrow as pa

KINDS = ("run", "iteration", "request")


@dataclass
class Batch:
    """Canonical records from one slice of a source file.

    ``lines`` is anything DuckDB can scan (Arrow table, Polars frame) with columns
    ``line_no`` (int) and ``raw`` (one canonical JSON object as text).  Converters
    that already rejected or skipped some source lines say so in ``rejects``
    (an Arrow table with line_no, reason, raw, or a list of such tuples) and
    ``skipped``; ``lines_read`` counts the source lines this batch covers.

    ``metrics``: engine metric samples (Prometheus scrapes), an Arrow table with
    ``line_no, t, family, labels (JSON text), kind, le, value``, stored in
    ``metric_samples`` for the batch's run; ``metric_lines`` of the source lines
    they came from count as accepted.
    """

    lines: object
    lines_read: int
    rejects: pa.Table | list[tuple[int, str, str]] = field(default_factory=list)
    skipped: int = 0
    metrics: pa.Table | None = None
    metric_lines: int = 0
    # lines already parsed and validated by canonical_sql.stage_sql, with their run_id
    # (the fast path of canonical JSONL files); ``lines`` is then unused
    staged: object | None = None
    # records a converter holds as typed columns (typed_sql.Typed), checked by the same
    # rules without a detour through JSON text; ``lines`` then holds only its run record
    # (checked by the statement for run records alone: a record of another kind there is rejected)
    typed: object | None = None
    # request ids that are only positions in the file (a bench JSON's entry index): a second
    # such file of the same run would repeat them, so there they are named after the file
    positional_ids: bool = False
    # what the converter left out or did that the user should know (printed under the ingest line)
    notes: list[str] = field(default_factory=list)


# What to check when a file of a format holds no record of it.
NO_RECORDS_HINT = {
    "vllm-log": "vLLM logs Iteration(N) lines only with --enable-logging-iteration-details (or is --format right?)",
    "sglang-log": "SGLang logs Prefill/Decode batch lines at log level info (or is --format right?)",
    "aiperf": "AIPerf's warmup records (metadata.benchmark_phase = warmup) are skipped, not measured "
    "(or is --format right?)",
}


@dataclass
class IngestResult:
    path: str
    format: str
    lines_read: int = 0
    accepted: int = 0
    rejected: int = 0
    skipped: int = 0
    run_ids: list[str] = field(default_factory=list)
    status: str = "ingested"  # ingested | unchanged | replaced | skipped
    note: str = ""
    removed_runs: list[str] = field(default_factory=list)  # runs of the replaced ingests (they may be gone)
    # run facts this file gives differently from another file of the same run (see run_conflicts)
    conflicts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the loader did that the user should know
    stored_as: str = ""  # unchanged: the path its content was ingested from (maybe another name)
    held_runs: list[str] = field(default_factory=list)  # unchanged: the runs that ingest of it holds
    hint: str = ""  # skipped: what to do with the file instead (default: name its format)
    companion: bool = False  # skipped: a file a benchmark writes beside its records (.companions)

    def line(self) -> str:
        path = str(self.path)
        if UNSAFE_IN_ID.search(path):  # a newline in a file's name would forge a line of output
            path = shown_id(path)
        if self.companion:
            return f"{path}: {self.note}"
        if self.status == "skipped":
            return f"{path}: skipped ({self.note}); {self.hint or 'name it with --format NAME to ingest it'}"
        if self.status == "unchanged":
            return f"{path}: unchanged (same content already ingested{self.note}); use --replace to re-load"
        runs = ", ".join(self.run_ids[:5]) + (" ..." if len(self.run_ids) > 5 else "")
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        gone = [r for r in self.removed_runs if r not in self.run_ids]
        return (
            f"{path} [{self.format}]: {self.lines_read} read, {self.accepted} accepted, "
            f"{self.rejected} rejected{skipped}; runs: {runs or 'none'}"
            + (" (replaced)" if self.status == "replaced" else "")
            + (
                ""
                if self.accepted or self.rejected
                else "; no records in it"
                if not self.lines_read
                else f"; no {self.format} records in it: {NO_RECORDS_HINT.get(self.format, 'is --format right?')}"
            )
            + (f"; runs of the replaced ingest no longer loaded by it: {', '.join(gone)}" if gone else "")
        )


@dataclass
class _State:
    ingest_id: int
    path: str
    default_run: str
    carry_run: str | None = None
    result: IngestResult | None = None
    # runs this file's earlier batches had valid records of: a later batch of them is checked (_checks)
    loaded_runs: set[str] = field(default_factory=set)


# Intermediate results are Arrow tables held by _Scope, not temp tables: inside
# the file's transaction DuckDB keeps every replaced temp table until commit.

# The run of each line: its own run_id, else that of the last run record before it
# (in this batch, or carried from earlier batches), else --run-id or the file name.
# A batch names few runs (a converter's own record on line 0, a file's on line 1): a CASE
# over their lines says it; a window over every line (a sort) only for batches with many.
RUN_OF_LINE_SQL = {
    False: "select *, coalesce(own_run, {last}, $carry_run, $default_run) as run_id from lines",
    True: """
select *,
  coalesce(own_run,
    last_value(case when kind = 'run' then coalesce(own_run, $default_run) end ignore nulls)
      over (order by line_no rows between unbounded preceding and current row),
    $carry_run, $default_run) as run_id
from lines
""",
}
MAX_RUN_CASES = 64


def last_run_case(run_lines: list[tuple[int, str]], line_no: str = "line_no") -> tuple[str, dict]:
    """SQL for the run of the last run record at or before each line, and its parameters.

    ``run_lines``: ``(line, run)`` of the run records, in line order (at most
    ``MAX_RUN_CASES``). NULL before the first of them.
    """
    params: dict = {}
    whens = []
    for i, (line, run) in reversed(list(enumerate(run_lines))):
        whens.append(f"when {line_no} >= $rl{i} then $rr{i}")
        params[f"rl{i}"], params[f"rr{i}"] = line, run
    return (f"case {' '.join(whens)} end" if whens else "NULL::varchar"), params


_KEYS = {"iteration": ("iter", "v_iter"), "request": ("req_id", "v_req_id")}
_TARGET = {"iteration": "iterations", "request": "requests"}


# What to do about a record another file of its run holds. Whether the file names its run
# itself (a run record, run_id fields: --run-id names only records that name none) or a
# converter named it (appended bench results, a log's engines) is not known here, so both ways
# out are given.
_ANOTHER = {
    "iteration": "a run holds one step log; to load it as another run give it another --run-id (for records "
    "that name no run) or edit the run id in the file (a run record or run_id fields, which --run-id does not "
    "change), or leave one of the two out; parts of one log whose steps straddle them (rotated "
    "ForwardPassMetrics files) go in joined: cat A B > AB",
    "request": "if it is another run, give it another --run-id (for records that name no run) or edit the run "
    "id in the file (a run record or run_id fields, which --run-id does not change); if it is a copy, leave it out",
}


def _duplicates_sql(kind: str) -> str:
    """The valid records of a kind in ``staged`` that lose their key to another record, with why.

    Only keys that occur twice in the batch or are already stored are looked at: most
    batches have none, and then nothing else of the batch is copied (accepted rows go
    straight from ``staged`` to their table).
    """
    col, val = _KEYS[kind]
    table = _TARGET[kind]
    return f"""
select t.line_no, t.raw,
  case when d.first_line is not null and d.first_line <> t.line_no then
         'duplicate {col} ' || t.{val} || ' in run ' || t.run_id || ' (first at line ' || d.first_line || ')'
       when e.line_no is not null and e.ingest_id = $ingest_id then
         'duplicate {col} ' || t.{val} || ' in run ' || t.run_id || ' (first at line ' || e.line_no || ')'
       when e.line_no is not null and e.path = $path then
         'duplicate {col} ' || t.{val} || ' in run ' || t.run_id || ' (already stored from line '
         || e.line_no || ' of ' || e.path || '; use --replace to re-load that file)'
       when e.line_no is not null then
         -- another file of the run holds it: --replace of this one would meet it again
         'duplicate {col} ' || t.{val} || ' in run ' || t.run_id || ' (already stored from line '
         || e.line_no || ' of ' || e.path || ', another file: {_ANOTHER[kind]})'
  end as final_reason
from (select line_no, run_id, {val}, raw from staged where kind = '{kind}' and reason is null) t
left join (
  -- the first VALID record with this key keeps it; a rejected one never blocks a later good one.
  -- Keys seen twice only (an aggregate, not a window over every record: duplicates are rare)
  select run_id, {val}, min(line_no) as first_line
  from staged where kind = '{kind}' and reason is null group by all having count(*) > 1
) d on d.run_id = t.run_id and d.{val} = t.{val}
left join (
  -- only the keys of this batch: earlier batches of a big file are not re-aggregated
  select x.run_id, x.{col}, arg_min(x.line_no, x.ingest_id) as line_no, min(x.ingest_id) as ingest_id,
    arg_min(g.path, x.ingest_id) as path
  from (select * from {table} semi join (select run_id, {val} from staged where kind = '{kind}' and reason is null) s
        on s.run_id = {table}.run_id and s.{val} = {table}.{col}) x
  left join ingests g using (ingest_id)
  group by all
) e on e.run_id = t.run_id and e.{col} = t.{val}
where (d.first_line is not null and d.first_line <> t.line_no) or e.line_no is not null
"""


# The accepted records of a kind: valid, and not among the duplicates found (``losers``,
# a line_no column; the condition is left out when there are none).
ACCEPTED = "from staged where kind = '{kind}' and reason is null{without}"
WITHOUT_LOSERS = " and line_no not in (select line_no from losers)"

INSERT_SQL = {
    "iteration": """
insert into iterations
select run_id, v_iter,
  coalesce(v_t_start, v_t_end - v_dur_ms / 1000), coalesce(v_t_end, v_t_start + v_dur_ms / 1000),
  coalesce(v_dur_ms, (v_t_end - v_t_start) * 1000),
  v_prefill_tokens, v_prefill_reqs, v_decode_tokens, v_decode_reqs, v_context_tokens,
  v_running_reqs, v_waiting_reqs, v_kv_usage, v_preempted_reqs, v_req_ids, extra, $ingest_id, line_no
{accepted}
""",
    "request": """
insert into requests
select run_id, v_req_id, v_t_arrival, v_t_scheduled, v_t_first_token, v_t_finish, v_prompt_tokens,
  coalesce(v_output_tokens, len(v_token_times)), v_cached_tokens, v_preemptions, coalesce(v_status, 'ok'),
  extra, $ingest_id, line_no
{accepted}
""",
}

# Each request's token times as one list: the ``tokens`` view unnests them when read
# (store.TOKENS_VIEW); a row per token written here cost more than the rest of the ingest.
TOKENS_SQL = """
insert into token_lists
select run_id, v_req_id, v_token_times, $ingest_id
{accepted} and len(v_token_times) > 0
"""

RUN_FIELDS = ("engine", "engine_version", "model", "gpu", "num_gpus", "dtype", "kv_dtype", "clock")


def merge_runs_sql(source: str) -> str:
    """One merged row per run of ``source`` (columns run_id, k, ingest_id, RUN_FIELDS, meta).

    Later records win (``k`` orders them): the last non-null value of each field, and
    the metas applied in order as JSON merge patches (RFC 7386: a null removes a key).
    ``ingest_id``: the first ingest that named the run.
    """
    fields = ",\n  ".join(f"arg_max({f}, k) filter ({f} is not null) as {f}" for f in RUN_FIELDS)
    return f"""
select run_id,
  {fields},
  nullif(list_reduce(list(meta order by k) filter (meta is not null),
                     lambda a, b: json_merge_patch(a, b), '{{}}'::json)::varchar, '{{}}')::json as meta,
  min(ingest_id) as ingest_id
from ({source}) group by run_id
"""


# The accepted run records of a batch, stored as they came; their runs are then merged
# again from all their records (remerge_runs), the same path a --replace takes. A run record's
# fields the format does not know go into its meta (runs have no extra column; meta is their
# free-form part), under meta's own keys: a key meta names too is meta's. Null fields are left
# out (applied to {} as a merge patch): the run's metas merge that way too, where a null removes
# a key, and a Parquet row holds every column of the file, null where the record has no such field.
RUN_RECORDS_SQL = (
    "insert into run_records select $ingest_id, line_no, run_id, "
    + ", ".join(f"v_{f}" for f in RUN_FIELDS)
    + ", case when extra is null then v_meta else "
    + "nullif(json_merge_patch(json_merge_patch('{}', extra), coalesce(v_meta, '{}')), '{}') end"
    + " from staged where kind = 'run' and reason is null"
)

# Every line rejected before the duplicate check (duplicates are added per kind).
LINE_REJECTS_SQL = """
insert into rejects select $ingest_id, $path, line_no, reason, raw from staged
where reason is not null and reason <> 'blank'
"""

# What a batch's lines came to, before duplicates: skipped (blank), rejected here,
# run records accepted, and a converter's own run record (line 0) rejected. Then, for the
# duplicate check of each kind (load_batch), whether a key is twice among the batch's valid
# records of the kind, and the runs of its valid records. A NULL key counts as a repeat here,
# which only costs the check. Keys are counted by their hash: equal keys hash equal (DuckDB's
# grouping rests on it; -0.0 and 0.0 too), so a repeat is never missed, and two keys that
# collide only cost the exact check (load_batch). Half the CPU of distinct (run, key) structs.
_REPEATS = """count(*) filter (where kind = '{kind}' and reason is null)
    > count(distinct hash(run_id, {val})) filter (where kind = '{kind}' and reason is null)"""
# A big batch's steps are asked for the bounds of their numbers instead (a list [min, max],
# NULL without valid steps), and _step_repeats decides with them.
_ITER_BOUNDS = (
    "[min(v_iter) filter (where kind = 'iteration' and reason is null), "
    "max(v_iter) filter (where kind = 'iteration' and reason is null)]"
)


def _line_counts_sql(step_bounds: bool) -> str:
    steps = _ITER_BOUNDS if step_bounds else _REPEATS.format(kind="iteration", val=_KEYS["iteration"][1])
    return f"""
select count(*) filter (where reason = 'blank'),
  count(*) filter (where reason is not null and reason <> 'blank'),
  count(*) filter (where kind = 'run' and reason is null and line_no > 0),
  count(*) filter (where kind = 'run' and reason is not null and line_no = 0),
  count(*) filter (where kind = 'run'),
  count(*) filter (where kind = 'iteration') > 0,
  count(*) filter (where kind = 'request') > 0,
  arg_max(run_id, line_no) filter (where kind = 'run'),
  {steps},
  {_REPEATS.format(kind="request", val=_KEYS["request"][1])},
  list(distinct run_id) filter (where kind in ('iteration', 'request') and reason is null)
from staged
"""


# by whether the batch is big (store.EXECUTE_ROWS_MAX): see _step_repeats
LINE_COUNTS_SQL = {False: _line_counts_sql(False), True: _line_counts_sql(True)}
# A set bit per step number of the batch: fewer bits than steps is a number twice. A tenth of
# the CPU of counting distinct hashes (0.02 against 0.12 s on a million steps), for one run's
# steps whose numbers span at most this many (a bit string of 8 MiB per thread at most).
STEP_BITS_MAX = 1 << 26
_STEP_BITS_SQL = (
    "select count(*) > bit_count(bitstring_agg(v_iter, $lo, $hi)) from staged "
    "where kind = 'iteration' and reason is null"
)
_STEP_HASH_SQL = f"select {_REPEATS.format(kind='iteration', val=_KEYS['iteration'][1])} from staged"


def _step_repeats(q: _Scope, bounds: list | None, runs: list[str]) -> bool:
    """Whether a big batch's valid steps may repeat a (run, iter) key. The bit string looks at
    step numbers alone, so with several runs (each may count from 0) it would find repeats
    that are none, each costing the exact check: those batches count hashes as small ones do."""
    lo, hi = bounds
    if lo is None:
        return False
    if len(runs) == 1 and hi - lo < STEP_BITS_MAX:
        return bool(q.count(_STEP_BITS_SQL, {"lo": lo, "hi": hi}))
    return bool(q.count(_STEP_HASH_SQL))


# Whether the runs $r have records of each kind stored (a scan of the tables' run ids: 50-150 ms
# on a store of 20M steps, so asked only when the batch holds no repeat of its own and no
# earlier batch of the file loaded these runs; see _checks).
STORED_SQL = f"""
select {", ".join(f"exists (select 1 from {_TARGET[k]} where run_id = any($r))" for k in ("iteration", "request"))}
"""

ENSURE_RUNS_SQL = """
insert into runs (run_id, ingest_id)
select distinct run_id, $ingest_id from (
  select distinct run_id from iterations union all select distinct run_id from requests
  union all select distinct run_id from metric_samples
) where run_id not in (select run_id from runs)
"""

DUPLICATE_REJECTS_SQL = "insert into rejects select $ingest_id, $path, line_no, final_reason, raw from losers"


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(scalar(con, sql))


class _Scope:
    """The intermediate Arrow tables of one batch, visible to SQL by name.

    DuckDB resolves an unknown table name against the variables of the Python
    frame that runs the query (a replacement scan).  Unlike ``con.register`` this
    leaves nothing in the catalog, so the file's open transaction does not keep
    every batch's intermediates alive until commit (memory would grow with the file).
    """

    NAMES = ("batch_in", "typed_in", "lines", "staged", "losers", "rejects_in")

    def __init__(self, con: duckdb.DuckDBPyConnection, batch_in: object, result: IngestResult, rows: int):
        self.con, self.result = con, result
        self.tables: dict[str, object] = {"batch_in": batch_in}
        # a small batch's tables are made by executed statements (one bind, see store.arrow)
        self.relation = rows > store.EXECUTE_ROWS_MAX

    def _run(self, sql: str, params: dict | None, fetch: str):
        batch_in, typed_in, lines, staged, losers, rejects_in = (self.tables.get(n) for n in self.NAMES)  # noqa: F841
        if fetch == "arrow" and self.relation:
            return self.con.sql(sql, params=params).to_arrow_table()
        result = self.con.execute(sql, params) if params else self.con.execute(sql)
        return arrow(result) if fetch == "arrow" else result.fetchall()

    def table(self, name: str, sql: str, params: dict | None = None, optimise: bool = True) -> None:
        """``optimise=False``: a small batch's statement runs without DuckDB's optimiser (the
        staging statement: see canonical.UNOPTIMISED_MAX_BYTES); a big one keeps it."""
        with store.unoptimised(self.con, when=not optimise and not self.relation):
            self.tables[name] = self._run(sql, params, "arrow")

    def run(self, sql: str, params: dict | None = None) -> list:
        return self._run(sql, params, "rows")

    def count(self, sql: str, params: dict | None = None) -> int:
        return int(self.run(sql, params)[0][0])


def _rejects_table(rejects: pa.Table | list[tuple[int, str, str]]) -> pa.Table:
    import pyarrow as pa

    if isinstance(rejects, pa.Table):
        return rejects.select(["line_no", "reason", "raw"])
    cols = list(zip(*rejects)) if rejects else [(), (), ()]
    return pa.table(
        {
            "line_no": pa.array(cols[0], pa.int64()),
            "reason": pa.array(cols[1], pa.string()),
            "raw": pa.array(cols[2], pa.string()),
        }
    )


def _load_metrics(con: duckdb.DuckDBPyConnection, batch: Batch, st: _State) -> None:
    """A converter's metric samples, stored for the run its records are in (a run record of
    this batch, else the file's run)."""
    con.register("metrics_in", batch.metrics)
    try:
        con.execute(
            "insert into metric_samples select $run, t, family, labels::json, kind, le, value, $ingest_id, "
            "line_no from metrics_in",
            {"run": st.carry_run or st.default_run, "ingest_id": st.ingest_id},
        )
    finally:
        con.unregister("metrics_in")
    st.result.accepted += batch.metric_lines


STAGE_BATCH_SQL = stage_sql("batch_in")
# A batch of typed records brings in ``lines`` only its converter's run record: the statement
# for run records alone binds in a fifth of the time, most of a small engine file's ingest.
STAGE_RUN_LINES_SQL = stage_sql("batch_in", kinds=("run",))


def batch_rows(batch: Batch) -> int:
    """The records a batch holds: its lines, its typed records, or its staged slice. Not
    ``lines_read``: a converter's later slices of one read cover no new line (0) and its
    first may cover the whole file."""
    rows = len(batch.lines) if batch.lines is not None else 0  # an Arrow table or a Polars frame
    if batch.typed is not None:
        rows = max(rows, len(batch.typed.table))
    if batch.staged is not None:
        rows = max(rows, batch.lines_read)  # a slice of the file-wide staging: one record a line
    return rows


def load_batch(con: duckdb.DuckDBPyConnection, batch: Batch, st: _State) -> None:
    """Validate one batch in SQL and insert its accepted records and rejects.

    A batch of canonical JSON lines is parsed and validated by ``stage_sql`` (one pass);
    a pre-staged batch (the canonical JSONL fast path) comes with that done.  The rest,
    the same for both: duplicates, inserts, rejects and counts.
    """
    res = st.result
    assert res is not None
    q = _Scope(con, batch.lines, res, batch_rows(batch))
    if batch.staged is not None:
        q.tables["staged"] = batch.staged
    else:
        sql = STAGE_BATCH_SQL
        if batch.typed is not None:
            q.tables["typed_in"] = batch.typed.table
            typed = typed_stage_sql("typed_in", batch.typed)
            sql = f"({STAGE_RUN_LINES_SQL}) union all by name ({typed})" if batch.lines.num_rows else typed
        q.table("lines", sql, optimise=False)
        del q.tables["batch_in"]
        q.tables.pop("typed_in", None)
        params = {"default_run": st.default_run, "carry_run": st.carry_run}
        run_lines = q.run(
            "select line_no, coalesce(own_run, $default_run) from lines where kind = 'run' order by line_no "
            f"limit {MAX_RUN_CASES + 1}",
            {"default_run": st.default_run},
        )
        if len(run_lines) > MAX_RUN_CASES:
            q.table("staged", RUN_OF_LINE_SQL[True], params)
        else:
            last, case_params = last_run_case(run_lines)
            q.table("staged", RUN_OF_LINE_SQL[False].format(last=last), params | case_params)
        del q.tables["lines"]
    ids = {"ingest_id": st.ingest_id, "path": st.path}
    counts = q.run(LINE_COUNTS_SQL[q.relation])[0]
    skipped, rejected, runs_ok, runs_line0_bad, n_runs, has_iters, has_reqs, last_run, *repeats, runs = counts
    if q.relation:
        repeats[0] = _step_repeats(q, repeats[0], runs or [])
    checks = _checks(q, st, (has_iters, has_reqs), repeats, runs or [])
    q.run(LINE_REJECTS_SQL, ids)
    res.rejected += rejected
    res.skipped += batch.skipped + skipped
    res.lines_read += batch.lines_read
    res.notes.extend(batch.notes)
    rejects_in = _rejects_table(batch.rejects) if len(batch.rejects) else None
    if rejects_in is not None and rejects_in.num_rows:
        q.tables["rejects_in"] = rejects_in
        q.run("insert into rejects select $ingest_id, $path, line_no, reason, left(raw, 1024) from rejects_in", ids)
        res.rejected += rejects_in.num_rows
    if n_runs:
        st.carry_run = last_run
        q.run(RUN_RECORDS_SQL, {"ingest_id": st.ingest_id})
        remerge_runs(
            con, [r[0] for r in q.run("select distinct run_id from staged where kind = 'run' and reason is null")]
        )
        # a converter's own run record (line 0) is no line of the file: not read, not accepted;
        # rejected, it counts as a line read so that the reject shows in the sums
        res.accepted += runs_ok
        res.lines_read += runs_line0_bad
    if has_reqs and batch.positional_ids:
        _scope_positional_ids(q, st)
    for kind, present, check in zip(("iteration", "request"), (has_iters, has_reqs), checks):
        if present:
            _load_kind(q, kind, ids, check)
    if batch.metrics is not None and batch.metrics.num_rows:
        _load_metrics(con, batch, st)


# Valid request records whose id (with $prefix before it) another file of their run holds, and how
# many of those are the same request: same tokens in and out, same arrival on the file's own clock
POSITIONAL_CLASH_SQL = """
select count(*), count(*) filter (where r.prompt_tokens is not distinct from s.v_prompt_tokens
  and r.output_tokens is not distinct from coalesce(s.v_output_tokens, len(s.v_token_times))
  and abs(r.t_arrival - s.v_t_arrival) <= 1e-6)
from staged s join requests r
  on r.run_id = s.run_id and r.req_id = $prefix || s.v_req_id and r.ingest_id <> $ingest_id
where s.kind = 'request' and s.reason is null
"""


def _scope_positional_ids(q: _Scope, st: _State) -> None:
    """Name positional request ids after the file when another file of the run holds the same ids.

    Two ``vllm bench`` results of one run (two clients) both number their entries from 0:
    without this the second file's every request would be rejected as a duplicate.  A file
    whose clashing entries are those of the other file (the same result saved twice: same
    tokens, same arrivals on its own clock) keeps its ids, and its duplicates are rejected.
    """
    params = {"ingest_id": st.ingest_id, "prefix": ""}
    clash, same = q.run(POSITIONAL_CLASH_SQL, params)[0]
    if not clash or same >= 0.9 * clash:
        return
    name = Path(st.path).name
    for prefix in (f"{name}#", f"{name}@{st.ingest_id}#"):  # two files of one name (other folders)
        if not q.run(POSITIONAL_CLASH_SQL, params | {"prefix": prefix})[0][0]:
            break
    q.table(
        "staged",
        "select * replace (case when kind = 'request' then $prefix || v_req_id else v_req_id end as v_req_id) "
        "from staged",
        {"prefix": prefix},
    )
    q.result.notes.append(
        f"its request ids are entry numbers, and {clash} of them are already ids of another file of the run: "
        f"this file's are named {prefix}0, {prefix}1, ..."
    )


def _checks(q: _Scope, st: _State, present: tuple, repeats: list, runs: list[str]) -> tuple[bool, bool]:
    """Per kind (iteration, request), whether its duplicate check can find anything: a key twice
    among the batch's valid records, or records of its runs already stored. Most batches (a new
    run's file) have neither, and skip both checks (about 10 ms a kind on a small file)."""
    need = [bool(p) and not r for p, r in zip(present, repeats)]  # what the batch alone cannot settle
    earlier = not st.loaded_runs.isdisjoint(runs)  # an earlier batch of this file had records of them
    st.loaded_runs.update(runs)
    if not any(need) or not runs:
        return tuple(bool(r) for r in repeats)
    stored = (True, True) if earlier else tuple(bool(x) for x in q.run(STORED_SQL, {"r": runs})[0])
    return tuple(bool(r) or s for r, s in zip(repeats, stored))


def _load_kind(q: _Scope, kind: str, ids: dict, check: bool = True) -> None:
    """Insert the accepted records of one kind and reject the duplicates among them
    (``check`` false: none can be, see LINE_COUNTS_SQL)."""
    res = q.result
    dups = _duplicates_sql(kind)
    # counted first: most batches have none, and then no Arrow table (nor pyarrow) is needed
    where = {"ingest_id": ids["ingest_id"], "path": str(ids["path"])}
    n_losers = q.count(f"select count(*) from ({dups})", where) if check else 0
    if n_losers:
        q.table("losers", dups, where)
    accepted = ACCEPTED.format(kind=kind, without=WITHOUT_LOSERS if n_losers else "")
    res.accepted += q.count(INSERT_SQL[kind].format(accepted=accepted), {"ingest_id": ids["ingest_id"]})
    if kind == "request":
        q.run(TOKENS_SQL.format(accepted=accepted), {"ingest_id": ids["ingest_id"]})
    if n_losers:
        q.run(DUPLICATE_REJECTS_SQL, ids)
        res.rejected += n_losers
        del q.tables["losers"]


# convert(path, progress, run_name=...) -> batches; run_name is the run of records that
# name none (--run-id or the file name): a converter that splits a file into several
# runs names them after it.
Converter = Callable[..., Iterator[Batch]]


# the files of an LLMServingSim bench folder (vLLM's requests, engine gauges, run facts): one run
BENCH_FOLDER_FILES = ("meta.json", "requests.jsonl", "timeseries.csv")


def default_run_id(path: Path) -> str:
    """The run of records that name none and have no --run-id: the file name up to its first dot,
    or for the files of an LLMServingSim bench folder the folder's name (they are one run; named
    after the files, a folder made runs "meta", "requests" and "timeseries")."""
    if path.name in BENCH_FOLDER_FILES and _bench_folder(path.parent) and path.parent.name:
        return path.parent.name
    return path.name.split(".")[0] or path.name


def _bench_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an LLMServingSim bench ``meta.json`` (its keys, read from its head)."""
    try:
        with open(folder / "meta.json", "rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return all(k in head for k in ('"schema_version"', '"vllm_version"', '"engine_kwargs"'))


def ingest_file(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    fmt: str,
    convert: Converter,
    run_id: str | None = None,
    replace: bool = False,
    progress: Callable[[int], None] | None = None,
    tz: str | None = None,
) -> IngestResult:
    """Ingest one file as one transaction; see docs/canonical-format.md for the rules.

    ``tz`` reaches converters that read local wall-clock stamps (they take a ``tz`` argument).
    """
    reader.check_file(path)
    shown = str(path)
    default_run = run_id or default_run_id(path)
    # a converter may read the whole file in DuckDB first (canonical JSONL: its fast path);
    # None when it cannot, and its batches are read as usual
    stage = getattr(convert, "stage", None)
    staged = None
    try:
        # a stage that checks its lines against the file's count of double quotes gets it
        # from the hash's read of the file (see canonical.StagedJsonl)
        min_bytes = getattr(stage, "quote_count_min_bytes", None)
        count_quotes = min_bytes is not None and path.stat().st_size >= min_bytes and reader.compression(path) == "none"
        with ThreadPoolExecutor(1) as pool:
            hashing = pool.submit(reader.sha256_and_quotes, path, count_quotes)
            stage_kw = {"quotes": lambda: hashing.result()[1]} if count_quotes else {}
            # A file no earlier ingest could equal (no ingest of this size under this run name) is
            # staged while its hash is computed: hashlib leaves the GIL to DuckDB's threads.
            early = stage is not None and not _same_size_ingested(con, path, default_run)
            if early:
                staged = stage(con, path, default_run, **stage_kw)
            digest = hashing.result()[0]
        # Same bytes under another run name (file name or --run-id) are a different ingest.
        prior = con.execute(
            "select path, t_ingested, run_ids from ingests where sha256 = ? and default_run_id = ? "
            "order by ingest_id limit 1",
            [digest, default_run],
        ).fetchall()
        prior = prior[0] if prior else None
        if prior and not replace:
            note = "" if prior[0] == shown else f" as {prior[0]}"
            held = list(prior[2] or [])
            return IngestResult(shown, fmt, status="unchanged", note=note, stored_as=prior[0], held_runs=held)
        status = "replaced" if prior else "ingested"
        if stage is not None and not early:
            staged = stage(con, path, default_run, **stage_kw)

        report = _ShownProgress(progress) if progress is not None else None

        def attempt() -> IngestResult:
            result = IngestResult(shown, fmt, status=status)
            return _ingest_transaction(
                con, path, fmt, convert, result, digest, shown, default_run, replace, report, tz, staged
            )

        try:
            return attempt()
        except reader.FastReadFailed:
            # DuckDB's reader met a line it cannot read as it is after the converter had loaded
            # batches: the file was rolled back; it goes again, read by the Python line reader
            if report is not None:
                report.again()
            with reader.python_lines():
                return attempt()
    finally:
        if staged is not None:
            staged.close()


class _ShownProgress:
    """Byte counts for a progress bar over one file that may be read twice (DuckDB's reader,
    then the Python reader after a rollback): the second reading shows only what goes past
    the first, so the bar never runs back or past the file's size."""

    def __init__(self, progress: Callable[[int], None]):
        self.progress, self.shown, self.credit = progress, 0, 0

    def again(self) -> None:
        self.credit = self.shown

    def __call__(self, n: int) -> None:
        used = min(n, self.credit)
        self.credit -= used
        if n > used:
            self.shown += n - used
            self.progress(n - used)


# Why a run id is refused (printed, a newline in it would forge a line of output, U+202E reorder it)
NO_UNSAFE = "run ids may not hold control characters (tab and newline included) or bidi formatting characters"


def _unsafe(run_id: str) -> str:
    """The first character of ``run_id`` that no run id may hold, escaped and quoted."""
    found = UNSAFE_IN_ID.search(run_id)
    return shown_id(found.group()) if found else "nothing unsafe"


def check_run_id_option(run_id: str) -> None:
    """Refuse a ``--run-id`` that no run id may be, before any file is read."""
    if not run_id.strip():
        raise InputError(
            f"--run-id {shown_id(run_id)}: empty; give a name, or leave the option out to name runs after the files"
        )
    if UNSAFE_IN_ID.search(run_id):
        raise InputError(f"--run-id {shown_id(run_id)}: holds {_unsafe(run_id)}; {NO_UNSAFE}; give another --run-id")


def check_zone(tz: str) -> str:
    """``tz`` when it names a time zone, else an InputError (checked before any file is read:
    only log converters use it, and a wrong --tz must not pass unnoticed on the other files)."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InputError(
            f"--tz {shown_id(tz)} is not a known time zone; use an IANA name such as UTC or Europe/Berlin"
        ) from None
    return tz


def _refuse_unsafe_runs(con: duckdb.DuckDBPyConnection, result: IngestResult, ingest_id: int, default_run: str) -> None:
    """Refuse the file when a run it brings has a control or bidi formatting character in its id:
    printed, a newline in it would forge a line of output, U+202E would reorder it.  Only the
    file's few distinct runs are looked at; the error rolls the file's transaction back."""
    bad = next((r for r in result.run_ids if UNSAFE_IN_ID.search(r)), None)
    if bad is None:
        return
    if bad.startswith(default_run) and UNSAFE_IN_ID.search(default_run):  # a converter may suffix it
        raise InputError(
            f"{result.path}: its records that name no run take the run id {shown_id(bad)} from the file's "
            f"name, which holds {_unsafe(bad)}; {NO_UNSAFE}; give --run-id NAME (or rename the file); "
            "nothing of the file was stored"
        )
    first = scalar(
        con,
        "select min(line_no) from (select line_no from run_records where ingest_id = $i and run_id = $r "
        "union all select line_no from iterations where ingest_id = $i and run_id = $r "
        "union all select line_no from requests where ingest_id = $i and run_id = $r) where line_no > 0",
        {"i": ingest_id, "r": bad},
    )
    at = f" (first at line {first})" if first is not None else ""
    raise InputError(
        f"{result.path}: run id {shown_id(bad)}{at} holds {_unsafe(bad)}; {NO_UNSAFE}; rename the run id in "
        "the file (records that name no run take --run-id NAME); nothing of the file was stored"
    )


def _same_size_ingested(con: duckdb.DuckDBPyConnection, path: Path, default_run: str) -> bool:
    return bool(
        scalar(
            con,
            "select count(*) from ingests where bytes = ? and default_run_id = ?",
            [path.stat().st_size, default_run],
        )
    )


def _ingest_transaction(
    con, path, fmt, convert, result, digest, shown, default_run, replace, progress, tz, staged
) -> IngestResult:
    # a failed commit has rolled back already: the error keeps its cause (store.transaction)
    with store.transaction(con, lambda exc, state: InputError(f"{path}: ingest failed: {exc}; {state}")):
        n_removed, removed = _delete_ingests(con, digest, shown, default_run) if replace else (0, [])
        if n_removed:  # same path with new content counts as a replacement too
            result.status = "replaced"
            result.removed_runs = removed
        ingest_id = _count(con, "select nextval('ingest_seq')")
        st = _State(ingest_id, shown, default_run, result=result)
        if staged is not None:
            for batch in staged.batches(progress):
                load_batch(con, batch, st)
            staged.fill_raw(ingest_id)
        else:
            kwargs = {"tz": tz} if "tz" in inspect.signature(convert).parameters else {}
            for batch in convert(path, progress, run_name=default_run, **kwargs):
                load_batch(con, batch, st)
        if not result.accepted:  # nothing of the file loaded: its converter's run record goes too
            named = [
                r[0]
                for r in con.execute(
                    "select distinct run_id from run_records where ingest_id = ?", [ingest_id]
                ).fetchall()
            ]
            con.execute("delete from run_records where ingest_id = ?", [ingest_id])
            remerge_runs(con, named)
        con.execute(ENSURE_RUNS_SQL, {"ingest_id": ingest_id})
        result.run_ids = [
            r[0]
            for r in con.execute(
                "select distinct run_id from (select run_id from iterations where ingest_id = $i "
                "union all select run_id from requests where ingest_id = $i "
                "union all select run_id from metric_samples where ingest_id = $i "
                "union all select run_id from runs where ingest_id = $i "
                "union all select run_id from run_records where ingest_id = $i) order by 1",
                {"i": ingest_id},
            ).fetchall()
        ]
        _refuse_unsafe_runs(con, result, ingest_id, default_run)
        result.conflicts = run_conflicts(con, ingest_id)
        con.execute(
            "insert into ingests values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ingest_id,
                shown,
                digest,
                fmt,
                result.lines_read,
                result.accepted,
                result.rejected,
                result.skipped,
                path.stat().st_size,
                dt.datetime.now(),
                result.run_ids,
                default_run,
            ],
        )
        store.bump_generation(con, [*result.run_ids, *removed])
    return result


# Run facts two files of one run must agree on; engine and clock are left out (a client's
# records and a server's log of one run name different engines and clocks), and a model named
# as a path by one and a served name by the other (same last path part, any case) agrees.
CONFLICT_FIELDS = (
    ("model", "model"),
    ("engine_version", "engine_version"),
    ("gpu", "gpu"),
    ("num_gpus", "num_gpus::varchar"),
    ("dtype", "dtype"),
    ("kv_dtype", "kv_dtype"),
    ("meta.max_num_seqs", "meta->>'max_num_seqs'"),
    ("meta.max_num_batched_tokens", "meta->>'max_num_batched_tokens'"),
    ("meta.kv_cache_tokens", "meta->>'kv_cache_tokens'"),
)
RUN_CONFLICTS_SQL = f"""
with r as (
  select run_id, ingest_id, unnest([{", ".join(repr(n) for n, _ in CONFLICT_FIELDS)}]) as field,
         unnest([{", ".join(e for _, e in CONFLICT_FIELDS)}]) as value
  from run_records
  where ingest_id is not null and run_id in (select run_id from run_records where ingest_id = $i)
),
v as (select *, case when field = 'model' then lower(regexp_extract(value, '[^/]*$')) else value end as key from r)
select m.run_id, m.field, m.value, o.value, string_agg(distinct i.path, ', ' order by i.path)
from v m join v o on o.run_id = m.run_id and o.field = m.field and o.ingest_id <> m.ingest_id
left join ingests i on i.ingest_id = o.ingest_id
where m.ingest_id = $i and m.value is not null and o.value is not null and m.key <> o.key
group by all order by all
"""


def run_conflicts(con: duckdb.DuckDBPyConnection, ingest_id: int) -> list[str]:
    """What the run records of ingest ``ingest_id`` say differently from other files of their runs.

    The run keeps the value of the file ingested last (merge_runs_sql); these lines say so,
    so that two files of different runs merged under one --run-id do not pass unnoticed.
    """
    out = []
    for run_id, fld, mine, other, paths in con.execute(RUN_CONFLICTS_SQL, {"i": ingest_id}).fetchall():
        out.append(
            f"run {run_id}: {fld} is {mine!r} in this file but {other!r} in "
            f"{paths or 'another file'}; the run keeps this file's value (the last ingested). "
            "If the files are of different runs, ingest them with different --run-id"
        )
    return out


def _delete_ingests(con: duckdb.DuckDBPyConnection, digest: str, path: str, default_run: str) -> tuple[int, list[str]]:
    """Remove what earlier ingests of this content (or this path) loaded; returns how many and their runs."""
    which = "(sha256 = $d and default_run_id = $r) or path = $p"
    params = {"d": digest, "p": path, "r": default_run}
    n = int(scalar(con, f"select count(*) from ingests where {which}", params))
    runs = [r[0] for r in con.execute(f"select distinct unnest(run_ids) from ingests where {which}", params).fetchall()]
    for table in ("iterations", "requests", "token_lists", "metric_samples", "rejects", "runs", "run_records"):
        con.execute(f"delete from {table} where ingest_id in (select ingest_id from ingests where {which})", params)
    con.execute(f"delete from ingests where {which}", params)
    remerge_runs(con, runs)
    return n, runs


# Post-ingest steps that derive run metadata, each with its own record (line_no) per run.
DERIVED_CONTEXT, DERIVED_CLOCKS = 0, 1


def derive_run_meta(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    patch: dict | None,
    step: int = DERIVED_CONTEXT,
    clock: str | None = None,
) -> None:
    """Metadata a post-ingest step derived for a run (e.g. how context_tokens was estimated).

    Kept as a record without an ingest (one per step), applied after every file's
    records, so that it survives a --replace of any file; the step rewrites it when it
    runs again, and ``patch=None`` removes it.  ``clock``: the run's clock after the step
    (clock alignment puts every source on the reference's).
    """
    import json

    con.execute("delete from run_records where run_id = ? and ingest_id is null and line_no = ?", [run_id, step])
    if patch is not None or clock is not None:
        con.execute(
            "insert into run_records (ingest_id, line_no, run_id, clock, meta) values (NULL, ?, ?, ?, ?::json)",
            [step, run_id, clock, None if patch is None else json.dumps(patch)],
        )
    remerge_runs(con, [run_id])


def remerge_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """Rebuild the ``runs`` rows of ``run_ids`` from their stored run records.

    Used after every batch with run records and after ingests are removed, so a run
    always says what its remaining files said (not only the file that created it); where they
    disagree, a later file wins over an earlier one, except that a client's records (requests,
    no steps) never win over the run's other files.
    Runs left without records get a bare row at the end of the ingest if they still
    have steps or requests.
    """
    if not run_ids:
        return
    con.execute("delete from runs where run_id = any($r)", {"r": run_ids})
    # what a post-ingest step derived for a run that has neither files naming it nor data goes with it
    con.execute(
        "delete from run_records where ingest_id is null and run_id = any($r) and run_id not in "
        "(select run_id from run_records where ingest_id is not null union all select run_id from iterations "
        "union all select run_id from requests)",
        {"r": run_ids},
    )
    # records of post-ingest steps (ingest_id NULL, see derive_run_meta) come after every file's,
    # and those of a run's clients (files with its requests and none of its steps) before its other
    # files': a server log and a client's records of one run name two engines (and source
    # formats), and the run is the server's whichever file was loaded last
    source = (
        "select *, coalesce(case when ingest_id in (select ingest_id from requests where run_id = any($r)) "
        "and ingest_id not in (select ingest_id from iterations where run_id = any($r)) then 0 "
        "else 4611686018427387904 end + ingest_id * 4294967296 + line_no, 9223372036854000000 + line_no) "
        "as k from run_records where run_id = any($r)"
    )
    cols = ", ".join(RUN_FIELDS)
    con.execute(
        f"insert into runs select run_id, {cols}, meta, ingest_id from ({merge_runs_sql(source)})", {"r": run_ids}
    )


__all__ = ["Batch", "IngestResult", "ingest_file", "load_batch", "FIELDS", "TracelatError"]
