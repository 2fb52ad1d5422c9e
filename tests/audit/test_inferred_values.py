"""An SLO on queue or prefill time of a run whose t_scheduled was inferred from a server log's
steps: the audit says the value is an estimate, and does not decide a limit inside its uncertainty.

fixtures/vllm_queue: a vLLM bench JSON (no scheduling times) with the server log of the same run,
stamped to the second (server.log) or with sub-second Unix stamps (server_epoch.log).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest

from pipeline.cli import run_captured

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_queue"


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inferred")
    out = {}
    for log in ("server.log", "server_epoch.log"):
        db = d / f"{log}.duckdb"
        code, text = run_captured("ingest", FIX / "bench.json", FIX / log, "--run-id", "q", "--db", db)
        assert code == 0, text
        out[log] = db
    return d, out


def _values(db: Path, col: str) -> np.ndarray:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return np.array(
            [r[0] for r in con.execute(f"select {col} from request_latency where status = 'ok'").fetchall()]
        )
    finally:
        con.close()


def _uncertainty_ms(db: Path) -> float:
    con = duckdb.connect(str(db), read_only=True)
    try:
        info = json.loads(con.execute("select info from clock_alignments where run_id = 'q'").fetchall()[0][0])
    finally:
        con.close()
    return info["inferred"]["t_scheduled"]["p90_uncertainty_ms"]


def _audit(d: Path, db: Path, slo: str) -> tuple[int, dict]:
    f = d / "slo.toml"
    f.write_text(slo)
    code, out = run_captured("audit", "q", "--db", db, "--slo", f, "--json")
    return code, json.loads(out[: out.rindex("}") + 1])


def test_a_limit_within_the_uncertainty_is_not_decided(dbs):
    d, db = dbs
    u = _uncertainty_ms(db["server.log"])
    assert u == 1000  # stamped to the second, not re-timed
    p99 = float(np.percentile(_values(db["server.log"], "queue_ms"), 99))
    far = p99 + 5 * u
    code, res = _audit(d, db["server.log"], f"[slo]\nqueue_ms.p99 = {p99 + u / 2}\nqueue_ms.p50 = {far}\n")
    assert code == 2 and res["verdict"] == "error", res
    near, clear = res["checks"]
    # before: PASS, with nothing saying the value was a guess a second wide
    assert near["status"] == "error" and "cannot be decided" in near["message"] and "±1000 ms" in near["message"]
    assert near["observed"] == pytest.approx(p99)
    assert clear["status"] == "pass" and "an estimate: t_scheduled was inferred" in clear["message"]


def test_sub_second_stamps_decide_and_say_it_is_an_estimate(dbs):
    d, db = dbs
    u = _uncertainty_ms(db["server_epoch.log"])
    assert 0 < u < 200
    p50 = float(np.percentile(_values(db["server_epoch.log"], "queue_ms"), 50))
    assert p50 > 3 * u
    code, res = _audit(d, db["server_epoch.log"], f"[slo]\nqueue_ms.p50 = {p50 - 2 * u}\nttft_ms.p50 = 1e6\n")
    assert code == 1 and res["verdict"] == "fail", res
    pre, ttft = res["checks"]
    assert pre["status"] == "fail" and f"±{u:g} ms" in pre["message"]
    assert ttft["status"] == "pass" and "estimate" not in ttft["message"]  # TTFT is measured by the client
