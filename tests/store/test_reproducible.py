"""The same input gives the same summary, to the last bit: no aggregate depends on thread timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import ingest, store
from pipeline.summary import summary
from pipeline.commands.options import dumps

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo" / "incident.jsonl.gz"


def summary_bytes(db: Path) -> str:
    con = store.connect(db)
    try:
        con.execute("set threads = 4")  # parallel aggregation even on a small machine
        ingest.ingest_paths(con, [DEMO])
        store.build_derived(con)
        (run_id,) = store.known_runs(con)
        out = dumps(summary(con, run_id))  # what `tracelat summary RUN --json` prints
        # and the replay's corrections of the fitted model (means over the fit's steps)
        return out + dumps(store.rows(con, "replay/corrections", {"run_id": run_id}))
    finally:
        con.close()


# 2048-row groups are the harder case (more threads); DuckDB's default size runs under -m slow
@pytest.mark.parametrize("row_group_size", [pytest.param(None, marks=pytest.mark.slow), 2048])
def test_summary_json_is_identical_across_fresh_ingests(tmp_path, monkeypatch, row_group_size):
    # 142,730 token gaps, 13,720 steps, 1,220 requests: enough rows for DuckDB to split the work;
    # with 2048-row groups every table is scanned by several threads at once
    if row_group_size:
        monkeypatch.setattr(store, "ROW_GROUP_SIZE", row_group_size)
    outputs = [summary_bytes(tmp_path / f"s{i}.duckdb") for i in range(4)]
    assert '"tail"' in outputs[0] and '"std"' in outputs[0]
    for i, out in enumerate(outputs[1:], 1):
        if out != outputs[0]:
            diff = [(a, b) for a, b in zip(outputs[0].splitlines(), out.splitlines()) if a != b]
            raise AssertionError(f"store {i} differs from store 0: {diff[:6]}")


def test_run_summary_does_not_depend_on_the_order_of_the_steps(tmp_path):
    """busy_s adds every step's duration: as a float sum it came out 127.09414430923732 in file
    order and ...752 with the steps reversed; summed exactly, the same bits either way."""
    import json
    import math
    import random

    rng = random.Random(3)
    recs: list[dict] = [{"kind": "run", "run_id": "b"}]
    t = 0.0
    for i in range(5000):
        d = rng.uniform(0.001, 0.05)
        recs.append({"kind": "iteration", "iter": i, "t_start": t, "t_end": t + d, "decode_tokens": 3})
        t += d + rng.uniform(0, 0.01)
    rows = []
    for name, order in (("a", recs), ("b", recs[:1] + recs[:0:-1])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in order))
        con = store.connect(":memory:")
        ingest.ingest_paths(con, [path])
        store.build_derived(con)
        rows.append(con.execute("select * from run_summary").fetchall())
        busy_s = con.execute("select busy_s from run_summary").fetchall()[0][0]
        con.close()
    assert rows[0] == rows[1]
    assert busy_s == pytest.approx(math.fsum(r["t_end"] - r["t_start"] for r in recs[1:]), rel=1e-12)
