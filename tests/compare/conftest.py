"""Two synthetic runs in one store: a baseline and a candidate whose latencies are scaled."""

from __future__ import annotations

import json

import numpy as np
import pytest


def run_lines(run_id: str, scale: float, seed: int, n_req: int = 300, n_iter: int = 600) -> list[dict]:
    rng = np.random.default_rng(seed)
    lines: list[dict] = [{"kind": "run", "run_id": run_id, "clock": "monotonic"}]
    dur = rng.gamma(4.0, 2.0, n_iter) * scale / 1000
    t_end = np.cumsum(dur)
    for i in range(n_iter):
        lines.append(
            {
                "kind": "iteration",
                "iter": i,
                "t_start": float(t_end[i] - dur[i]),
                "t_end": float(t_end[i]),
                "decode_tokens": 8,
                "decode_reqs": 8,
                "context_tokens": 1000,
            }
        )
    for k in range(n_req):
        arrival = k * 0.05
        n = int(rng.integers(2, 30))
        ttft = rng.gamma(2.0, 30.0) * scale / 1000
        times = arrival + ttft + np.concatenate([[0.0], np.cumsum(rng.gamma(2.0, 5.0, n - 1) * scale / 1000)])
        lines.append(
            {
                "kind": "request",
                "req_id": f"q{k}",
                "t_arrival": arrival,
                "t_scheduled": arrival + ttft / 5,
                "t_first_token": float(times[0]),
                "t_finish": float(times[-1]),
                "output_tokens": n,
                "token_times": times.tolist(),
            }
        )
    return lines


@pytest.fixture
def run_file(tmp_path):
    """``run_file(run_id, scale, seed)``: write a synthetic run as canonical JSONL, return its path."""

    def make(run_id: str, scale: float, seed: int):
        path = tmp_path / f"{run_id}-{seed}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in run_lines(run_id, scale, seed)))
        return path

    return make


@pytest.fixture(scope="module")
def runs_db(tmp_path_factory):
    """A store with ``base``, ``same`` (same seed as base, other id), ``noise`` (other seed) and ``slow`` (x1.3).

    Shared by the module's tests, which only read it.
    """
    from pipeline import ingest, store

    tmp_path = tmp_path_factory.mktemp("runs")
    db_path = tmp_path / "runs.duckdb"
    con = store.connect(db_path)
    for rid, scale, seed in (("base", 1.0, 1), ("same", 1.0, 1), ("noise", 1.0, 2), ("slow", 1.3, 3)):
        path = tmp_path / f"{rid}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in run_lines(rid, scale, seed)))
        ingest.ingest_paths(con, [path])
    store.build_derived(con)
    yield con, db_path
    con.close()
