"""Per-request calibration (MAPE, Pearson r) against an independent computation on an ingested replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import store
from pipeline.cli import run_captured


@pytest.mark.long
def test_per_request_errors_match_the_ingested_replay(steady_db, tmp_path):
    code, text = run_captured(
        "replay",
        "steady",
        "--db",
        steady_db,
        "--json",
        "--seeds",
        "1",
        "--seed",
        "7",
        "--out",
        tmp_path / "r.jsonl",
        "--ingest",
    )
    assert code == 0, text
    doc = json.loads(text)
    rid = doc["replay_run_ids"][0]
    pr = doc["calibration_report"]["per_request"]
    con = store.connect(steady_db, read_only=True)
    rows = con.execute(
        "select o.ttft_ms, r.ttft_ms, o.e2e_ms, r.e2e_ms, o.tpot_ms, r.tpot_ms from request_latency o "
        "join request_latency r on r.req_id = o.req_id and r.run_id = ? "
        "where o.run_id = 'steady' and o.status = 'ok' and r.status = 'ok'",
        [rid],
    ).fetchall()
    con.close()
    a = np.array(rows, dtype=float)
    for k, m in enumerate(("ttft_ms", "e2e_ms", "tpot_ms")):
        o, r = a[:, 2 * k], a[:, 2 * k + 1]
        keep = np.isfinite(o) & np.isfinite(r) & (o > 0)
        o, r = o[keep], r[keep]
        got = pr[m]["per_seed"][0]
        assert pr[m]["n"] == len(o)
        assert got["mape"] == pytest.approx(np.mean(np.abs(r - o) / o), rel=1e-6)
        assert got["pearson_r"] == pytest.approx(np.corrcoef(o, r)[0, 1], rel=1e-6)
    # a well-calibrated replay of a simulated run: each request's E2E close to its recorded one
    assert pr["e2e_ms"]["mape"] < 0.1 and pr["e2e_ms"]["pearson_r"] > 0.9
    assert "per request (one to one" in run_captured("replay", "steady", "--db", steady_db, "--seeds", "1")[1]
