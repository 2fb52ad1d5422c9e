"""Derived tables are recomputed for the runs that changed only, and come out as a full rebuild would."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pipeline import ingest, store

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def snapshot(con) -> dict[str, pl.DataFrame]:
    out = {}
    for q in store.query_files():
        df = con.sql(f'select * from "{q.table}"').pl()
        out[q.table] = df.sort(df.columns, nulls_last=True)
    return out


def assert_same_as_full_rebuild(con) -> None:
    got = snapshot(con)
    store.build_derived(con, force=True)
    want = snapshot(con)
    for table, df in want.items():
        # DuckDB's parallel float sums may differ in the last bits between two runs of a query
        try:
            assert_frame_equal(got[table], df, check_exact=False, rel_tol=1e-12, abs_tol=1e-12)
        except AssertionError as exc:
            raise AssertionError(f"{table}: incremental build differs from a full rebuild: {exc}") from exc


@pytest.fixture
def spy(monkeypatch):
    calls: list[list[str]] = []
    real = store._rebuild_runs

    def wrapped(con, runs, *rest):
        calls.append(list(runs))
        return real(con, runs, *rest)

    monkeypatch.setattr(store, "_rebuild_runs", wrapped)
    return calls


def sim_trace(tmp_path: Path, name: str, seed: int) -> Path:
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.workload import poisson_workload
    from pipeline.sim.writer import write_trace

    model = IterationModel(t0_ms=5.0, a_ms_per_ctx=1e-4, b_ms_per_prefill=0.02, c_ms_per_decode=0.0)
    noise = NoiseModel(sigma=0.03, stall_rate=0.01, stall_ms_mean=20.0)
    policy = Policy(max_num_seqs=32, max_num_batched_tokens=512)
    res = simulate(poisson_workload(60, 10, 200, 0.6, 40, 0.6, seed=seed), policy, model, noise, seed=seed)
    return write_trace(res, tmp_path / f"{name}.jsonl", name, policy, model, noise)


def test_new_run_rebuilds_only_that_run(con, tmp_path, spy):
    a, b, c = (sim_trace(tmp_path, n, s) for n, s in (("a", 1), ("b", 2), ("c", 3)))
    ingest.ingest_paths(con, [a, b])
    assert store.pending_runs(con) is None  # no derived tables yet: full build
    store.build_derived(con)
    assert spy == [] and store.pending_runs(con) == []
    ingest.ingest_paths(con, [c])
    assert store.pending_runs(con) == ["c"]
    assert store.build_derived(con) is True
    assert spy == [["c"]]
    assert store.build_derived(con) is False
    assert_same_as_full_rebuild(con)


def test_replace_and_metadata_merge_are_tracked(con, tmp_path, spy):
    a, b = sim_trace(tmp_path, "a", 1), sim_trace(tmp_path, "b", 2)
    ingest.ingest_paths(con, [a, b])
    store.build_derived(con)
    # --replace of a with other content (its last records cut): a's rows change, b's do not
    a.write_text("\n".join(a.read_text().splitlines()[:-5]) + "\n")
    ingest.ingest_paths(con, [a], replace=True)
    assert store.pending_runs(con) == ["a"]
    store.build_derived(con)
    assert_same_as_full_rebuild(con)
    # run records only: metadata merged into run b, and a new run z without steps or requests
    meta = tmp_path / "meta.jsonl"
    meta.write_text(
        json.dumps({"kind": "run", "run_id": "b", "gpu": "h100-sxm"})
        + "\n"
        + json.dumps({"kind": "run", "run_id": "z", "gpu": "h100-sxm"})
        + "\n"
    )
    ingest.ingest_paths(con, [meta])
    assert store.pending_runs(con) == ["b", "z"]
    store.build_derived(con)
    assert con.execute("select requests, iterations from run_summary where run_id = 'z'").fetchall() == [(0, 0)]
    assert_same_as_full_rebuild(con)
    assert spy == [["a"], ["b", "z"]]


def test_replace_that_moves_rows_to_another_run(con, tmp_path, spy):
    a = tmp_path / "a.jsonl"  # records without run ids: the run is --run-id or the file name
    a.write_text(
        "".join(
            json.dumps(
                {
                    "kind": "request",
                    "req_id": f"r{i}",
                    "t_arrival": i,
                    "t_first_token": i + 0.1,
                    "t_finish": i + 0.5,
                    "output_tokens": 5,
                }
            )
            + "\n"
            for i in range(4)
        )
    )
    ingest.ingest_paths(con, [sim_trace(tmp_path, "other", 2), a])
    store.build_derived(con)
    ingest.ingest_paths(con, [a], run_id="renamed", replace=True)  # same path: the old ingest goes
    assert store.pending_runs(con) == ["a", "renamed"]
    store.build_derived(con)
    assert {r[0] for r in con.execute("select run_id from request_latency").fetchall()} == {"renamed", "other"}
    assert_same_as_full_rebuild(con)


def test_post_ingest_context_estimate_is_tracked(con, tmp_path, spy):
    other = sim_trace(tmp_path, "other", 4)
    ingest.ingest_paths(con, [other])
    store.build_derived(con)
    ingest.ingest_paths(con, [FIX / "vllm" / "server_epoch.log", FIX / "vllm" / "requests.jsonl"], run_id="vllm")
    assert store.pending_runs(con) == ["vllm"]
    store.build_derived(con)
    estimated = con.execute("select count(context_tokens) from iteration_metrics where run_id = 'vllm'").fetchall()[0][
        0
    ]
    assert estimated > 0
    assert_same_as_full_rebuild(con)
    assert spy == [["vllm"]]


def test_changed_queries_or_unknown_runs_rebuild_everything(con, tmp_path, spy):
    a, b = sim_trace(tmp_path, "a", 1), sim_trace(tmp_path, "b", 2)
    ingest.ingest_paths(con, [a])
    store.build_derived(con)
    con.execute("update _state set value = value + 1 where key = 'derived_sql'")  # as after an upgrade
    ingest.ingest_paths(con, [b])
    store.build_derived(con)
    assert spy == []
    con.execute("begin transaction")
    store.bump_generation(con)  # a writer that cannot say which runs it changed
    con.execute("commit")
    assert store.pending_runs(con) is None
    store.build_derived(con)
    assert spy == []
    assert_same_as_full_rebuild(con)


def test_failed_build_leaves_no_filter_views(con, tmp_path, monkeypatch):
    a, b = sim_trace(tmp_path, "a", 1), sim_trace(tmp_path, "b", 2)
    ingest.ingest_paths(con, [a])
    store.build_derived(con)
    ingest.ingest_paths(con, [b])
    broken = list(store.query_files())
    # the last materialised table fails (a view is never rebuilt per run)
    i = max(i for i, q in enumerate(broken) if not q.view)
    last = broken[i]
    broken[i] = store.QueryFile(last.path, last.table, last.grain, last.inputs, "select nosuchcolumn from runs")
    monkeypatch.setattr(store, "query_files", lambda *a: broken)
    monkeypatch.setattr(
        store, "_sql_digest", lambda files: store.scalar(con, "select value from _state where key = 'derived_sql'")
    )
    with pytest.raises(store.StoreError, match="building derived tables failed"):
        store.build_derived(con)
    monkeypatch.undo()
    # the connection sees every run again, and the failed build left the tables as they were
    assert {r[0] for r in con.execute("select distinct run_id from iterations").fetchall()} == {"a", "b"}
    assert {r[0] for r in con.execute("select distinct run_id from metric_stats").fetchall()} == {"a"}
    assert store.pending_runs(con) == ["b"]
    store.build_derived(con)
    assert_same_as_full_rebuild(con)
