"""stage_sql for some kinds only (an engine converter's run record) says exactly what the whole one says."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import ingest, store
from pipeline.ingest import load
from .props import budgets
from pipeline.ingest.canonical_sql import ALL_FIELDS, COMMON, FIELDS, UNWORDED, reasons_sql, stage_sql

# Run records good and bad: every run field in every JSON type, unknown fields, escapes,
# objects, parse errors, blank lines and a missing kind.
RUN_LINES = [
    {"kind": "run", "run_id": "a", "engine": "vllm", "model": "m", "num_gpus": 2, "clock": "unix"},
    {"kind": "run", "run_id": 7, "engine_version": "0.32.0", "gpu": "H200", "dtype": "bf16", "kv_dtype": "fp8"},
    {"kind": "run", "run_id": "b", "meta": {"max_num_seqs": 256, "nested": {"x": [1, 2]}}},
    {"kind": "run", "run_id": "c", "num_gpus": -1},
    {"kind": "run", "run_id": "d", "num_gpus": 1.5, "clock": "wall"},
    {"kind": "run", "run_id": "e", "num_gpus": "4", "engine": 3, "meta": [1, 2]},
    {"kind": "run", "run_id": "f", "model": 'q"uote\\back\u00e9', "extra_field": True, "other": None},
    {"kind": "run", "run_id": 1.5},
    {"kind": "run", "run_id": None, "engine": None, "num_gpus": None},
    {"kind": "run", "run_id": "g", "num_gpus": 2**60},
    {"kind": "run", "run_id": "h", "clock": "monotonic", "meta": None, "gpu": True},
    {"kind": "run"},
    {"run_id": "no kind"},
    {"kind": 3, "run_id": "i"},
]
RAW_LINES = [json.dumps(r) for r in RUN_LINES] + [
    json.dumps(RUN_LINES[0], separators=(",", ":")),  # compact: the clean path
    '{"kind":"run","run_id":"j","engine":"vllm"',  # truncated
    "[1, 2]",
    "",
    "   ",
    '{"kind": "run", "run_id": "k", "kind": "run"}',
]


COLS = ["line_no", "kind", "own_run", *(f"v_{n}" for n in ALL_FIELDS), "extra", "reason", "raw"]


_CON = duckdb.connect()  # one for all: binding the statement is most of a small case's time


def _staged(sql: str, raws: list[str]) -> list[dict]:
    batch_in = pa.table({"line_no": pa.array(range(1, len(raws) + 1), pa.int64()), "raw": pa.array(raws)})  # noqa: F841
    rows = _CON.execute(f"select {', '.join(COLS)} from ({sql}) order by line_no").fetchall()
    return [dict(zip(COLS, r)) for r in rows]


def _read_of(row: dict, kinds: tuple[str, ...]) -> dict:
    """What the loader reads of a staged line: all but the values of fields its kind does not have
    (the whole statement parses every field of every line; a run record's ``iter`` is never read)."""
    own = {f.name for k in kinds if k == row["kind"] for f in FIELDS[k]} | set(COMMON)
    return {c: v for c, v in row.items() if not c.startswith("v_") or c[2:] in own}


def _assert_alike(part: list[dict], whole: list[dict], kinds: tuple[str, ...]) -> None:
    assert [_read_of(p, kinds) for p in part] == [_read_of(w, kinds) for w in whole]
    # fields of no kind asked for are NULL in the partial statement
    asked = {f.name for k in kinds for f in FIELDS[k]} | set(COMMON)
    assert all(p[c] is None for p in part for c in p if c.startswith("v_") and c[2:] not in asked)


def test_run_only_statement_stages_run_lines_as_the_whole_one_does():
    whole = _staged(stage_sql("batch_in"), RAW_LINES)
    runs = _staged(stage_sql("batch_in", kinds=("run",)), RAW_LINES)
    _assert_alike(runs, whole, ("run",))
    # the lines above exercise what they should: valid records, and each kind of problem
    reasons = [r["reason"] for r in whole]
    valid = [i for i, r in enumerate(reasons) if r is None]
    assert valid == [0, 1, 2, 6, 8, 11, 14, 19]
    assert reasons[17] == reasons[18] == "blank"
    assert "num_gpus: negative count" in reasons[3]
    assert reasons[5].count(";") == 2  # three problems of one record, each named
    assert "not valid JSON" in reasons[15] and reasons[16] == "not a JSON object"
    assert json.loads(whole[6]["extra"]) == {"extra_field": True, "other": None}  # unknown fields kept


def test_run_only_statement_rejects_records_of_other_kinds():
    raws = [
        json.dumps({"kind": "iteration", "iter": 1, "t_start": 1.0, "t_end": 1.1}),
        json.dumps({"kind": "request", "req_id": "r", "t_arrival": 1.0}),
        json.dumps({"kind": "step"}),
    ]
    whole = _staged(stage_sql("batch_in"), raws)
    runs = _staged(stage_sql("batch_in", kinds=("run",)), raws)
    assert [r["reason"] for r in whole][:2] == [None, None]  # valid records of their kinds...
    assert [r["reason"] for r in runs][:2] == [
        "a iteration record is not expected here (only run)",
        "a request record is not expected here (only run)",
    ]  # ...are no run records: never taken silently with their fields dropped
    assert runs[2]["reason"] == whole[2]["reason"] == "unknown kind step (expected run, iteration or request)"
    # every column is there, typed as in the whole statement
    rel = duckdb.connect()
    batch_in = pa.table({"line_no": pa.array([1], pa.int64()), "raw": pa.array([raws[0]])})  # noqa: F841
    assert rel.sql(stage_sql("batch_in", kinds=("run",))).types == rel.sql(stage_sql("batch_in")).types


@pytest.mark.parametrize("kinds", [("iteration",), ("request",), ("run", "request")])
def test_statement_for_other_kinds_agrees_on_their_lines(kinds):
    raws = [
        json.dumps({"kind": "iteration", "iter": 1, "t_start": 1.0, "t_end": 1.1, "prefill_tokens": 3}),
        json.dumps({"kind": "iteration", "iter": "2", "t_start": 1.0, "dur_ms": -1, "x": 1}),
        json.dumps({"kind": "request", "req_id": "r", "t_arrival": 1.0, "token_times": [1.1, 1.0]}),
        json.dumps({"kind": "request", "req_id": 5, "t_arrival": 1.0, "t_first_token": 1.2, "status": "ok"}),
        json.dumps({"kind": "run", "run_id": "a", "num_gpus": 1}),
    ]
    whole = _staged(stage_sql("batch_in"), raws)
    part = _staged(stage_sql("batch_in", kinds=kinds), raws)
    for w, p, rec in zip(whole, part, raws):
        if json.loads(rec)["kind"] in kinds:
            _assert_alike([p], [w], kinds)
        else:
            assert p["reason"].endswith(f"record is not expected here (only {', '.join(kinds)})")


@pytest.mark.long
def test_small_engine_files_bind_the_small_statement():
    """Engine batches stage their run record with the run-only statement; the store is the same."""
    assert load.STAGE_RUN_LINES_SQL == stage_sql("batch_in", kinds=("run",))
    assert len(load.STAGE_RUN_LINES_SQL) < len(load.STAGE_BATCH_SQL) / 2
    con = duckdb.connect()
    batch_in = pa.table({"line_no": pa.array([0], pa.int64()), "raw": pa.array([RAW_LINES[0]])})  # noqa: F841
    for sql in (load.STAGE_BATCH_SQL, load.STAGE_RUN_LINES_SQL):
        con.sql(sql).fetchall()  # warm
    best = {"whole": 1e9, "runs": 1e9}
    for _ in range(5):  # interleaved: a busy moment slows both
        for name, sql in (("whole", load.STAGE_BATCH_SQL), ("runs", load.STAGE_RUN_LINES_SQL)):
            t = time.perf_counter()
            con.execute("explain " + sql).fetchall()
            best[name] = min(best[name], time.perf_counter() - t)
    assert best["runs"] < best["whole"] / 1.5, best  # measured: about 4x less (10 ms against 45 ms)


def test_engine_ingest_stores_the_same_through_the_run_only_statement(tmp_path, monkeypatch):
    """The vLLM bench JSON ingested with the whole statement and with the run-only one: same store."""
    bench = Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "bench.json"
    stores = {}
    for name in ("whole", "runs"):
        if name == "whole":
            monkeypatch.setattr(load, "STAGE_RUN_LINES_SQL", load.STAGE_BATCH_SQL)
        else:
            monkeypatch.undo()
        con = store.connect(tmp_path / f"{name}.duckdb")
        ingest.ingest_paths(con, [bench])
        stores[name] = {
            t: con.execute(f"select * exclude (ingest_id) from {t} order by all").fetchall()
            for t in ("runs", "requests", "token_lists", "run_records", "rejects")
        }
        con.close()
    assert stores["runs"] == stores["whole"]
    assert len(stores["runs"]["requests"]) == 64 and len(stores["runs"]["runs"]) == 1


# Any JSON value, and run records made of run fields, a few other names, and any values.
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_run_names = [n for n, f in ALL_FIELDS.items() if n in {"run_id", "engine", "model", "num_gpus", "clock", "meta"}]
_values = st.one_of(
    _json, st.sampled_from(["unix", "monotonic", "vllm"]), st.integers(0, 16), st.just({"max_num_seqs": 8})
)
_records = st.dictionaries(
    st.sampled_from([*_run_names, "engine_version", "gpu", "dtype", "kv_dtype", "iter", "req_id", "x", "kind "]),
    _values,
    max_size=7,
).map(lambda d: {"kind": "run", **d})


@pytest.mark.parametrize("examples", budgets(20, 60))
@pytest.mark.long
def test_any_run_records_stage_alike(examples):
    """Whatever a run record holds (any JSON in any field, unknown names, compact or spaced JSON),
    the statement for run records says of it what the whole one says."""

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None)
    @given(records=st.lists(_records, min_size=1, max_size=8), compact=st.booleans())
    def prop(records, compact):
        seps = (",", ":") if compact else (", ", ": ")
        raws = [json.dumps(r, separators=seps) for r in records]
        run_only = _staged(stage_sql("batch_in", kinds=("run",)), raws)
        _assert_alike(run_only, _staged(stage_sql("batch_in"), raws), ("run",))

    prop()


# Records of any kind with any canonical fields (their own or another kind's), unknown names and
# any values: the clean test must never let a line through that the slow path reads otherwise.
_any_records = st.builds(
    lambda kind, fields: {"kind": kind, **fields},
    st.sampled_from(["run", "iteration", "request"]),
    st.dictionaries(
        st.sampled_from([*ALL_FIELDS, "x", "gpu_temp_c"]),
        st.one_of(
            st.floats(-1e6, 1e6, allow_nan=False),
            st.integers(0, 1000),
            st.text(max_size=5),
            st.lists(st.floats(0, 10, allow_nan=False), max_size=4).map(sorted),
            _json,
        ),
        max_size=8,
    ),
)


@pytest.mark.parametrize("examples", budgets(20, 60))
@pytest.mark.long
def test_clean_lines_read_as_the_slow_path_reads_them(examples):
    """A compact line that passes the clean test (no second look at its text) is staged exactly as
    the same record with one more unknown field, which always takes the slow path (json_type,
    json_keys): same values and reasons, and the same extra but for that field."""

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None)
    @given(records=st.lists(_any_records, min_size=1, max_size=8))
    def prop(records):
        fast = _staged(stage_sql("batch_in"), [json.dumps(r, separators=(",", ":")) for r in records])
        slow = _staged(stage_sql("batch_in"), [json.dumps({**r, "zz_slow": 1}, separators=(",", ":")) for r in records])
        for f, s in zip(fast, slow):
            same = ("extra", "raw")  # raw: rejected lines keep their text, which differs by the field
            assert {k: v for k, v in f.items() if k not in same} == {k: v for k, v in s.items() if k not in same}
            if s["reason"] is None:  # stored: extra is the record's unknown fields, with zz_slow on the slow side
                slow_extra = json.loads(s["extra"])
                assert slow_extra.pop("zz_slow") == 1
                assert (json.loads(f["extra"]) if f["extra"] is not None else {}) == slow_extra

    prop()


def test_a_failed_check_rejects_even_when_its_message_is_null():
    """Flagged means rejected: a message that comes out NULL never lets the record through."""
    con = duckdb.connect()
    sql = reasons_sql([[("x > 1", "NULL::varchar"), ("x > 0", "'small'")], [("x < 0", "'negative'")]])
    got = [
        r[0] for r in con.execute(f"select {sql} from (values (2), (0.5), (0), (-1)) t(x) order by x desc").fetchall()
    ]
    assert got == [UNWORDED, "small", None, "negative"]
