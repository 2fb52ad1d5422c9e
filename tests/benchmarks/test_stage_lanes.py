"""benchmarks/bench_stage_lanes.py: its typed variant does the staging's work, so its time bounds a typed parse."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import duckdb

from pipeline.sim import NO_NOISE, IterationModel, Policy, poisson_workload, simulate
from pipeline.sim.writer import write_trace

ROOT = Path(__file__).resolve().parents[2]


def _lanes():
    saved_path, saved_modules = sys.path[:], set(sys.modules)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports bench_ingest beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_stage_lanes", ROOT / "benchmarks" / "bench_stage_lanes.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            if name.startswith("bench_"):
                del sys.modules[name]


def test_typed_variant_stages_the_same_rows(tmp_path):
    policy, model = Policy(max_num_seqs=16, max_num_batched_tokens=512, kv_capacity_tokens=5000), IterationModel()
    result = simulate(poisson_workload(60, 30.0, 300, 0.8, 30, 0.8, seed=2), policy, model, NO_NOISE, seed=1)
    trace = write_trace(result, tmp_path / "t.jsonl", "r1", policy, model, NO_NOISE, {"requests": 60})
    lines = trace.read_text().count("\n")
    mod = _lanes()
    sqls = mod.statements()
    con = duckdb.connect()
    for name in ("floor", "stage", "stage_typed"):
        con.execute(f"create table {name} as {sqls[name]}", {"path": str(trace)})
        assert con.execute(f"select count(*) from {name}").fetchall()[0][0] == lines, name
    # every line valid, and the typed variant computes the very rows the staging does
    assert con.execute("select count(reason) from stage").fetchall()[0][0] == 0
    for a, b in (("stage", "stage_typed"), ("stage_typed", "stage")):
        q = f"select count(*) from (select * exclude (raw, quotes) from {a} except all select * exclude (raw, quotes) from {b})"
        assert con.execute(q).fetchall()[0][0] == 0, (a, b)
    # the staged iteration times are the file's (the floor reads them with the schema given)
    assert (
        con.execute(
            "select count(*) from stage s positional join (select * from floor) f "
            "where s.v_t_start is distinct from f.t_start or s.v_iter is distinct from f.iter"
        ).fetchall()[0][0]
        == 0
    )


def test_row_number_probe_tells_supported_from_not_and_from_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    mod = _lanes()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text('{"kind":"run"}\n')
    con = duckdb.connect()
    assert mod.row_numbers(con, "read_parquet($path)", {"path": str(tmp_path / "t.parquet")}) is True
    # DuckDB 2.0.1 and 1.5.6 number neither; a definite answer either way, never an error taken for "no"
    for sql, params in mod.readers(tmp_path / "t.jsonl").values():
        assert mod.row_numbers(con, sql, params) in (True, False)
    assert mod.row_numbers(con, "read_parquet($path)", {"path": str(tmp_path / "missing.parquet")}) is None
