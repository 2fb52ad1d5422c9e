"""Synthetic runs for report tests: seeded numpy draws written as canonical JSONL, then ingested."""

from __future__ import annotations

import json

import numpy as np
import pytest

HOSTILE_RUN = '<script>alert("run")</script>\'"&<!--' + "\u00e9\u4e2d\U0001f600" + "x" * 400
HOSTILE_MODEL = '</script><img src=x onerror=alert(1)> "model"'
HOSTILE_REQ = '<b onmouseover="alert(2)">r</b>'
SCRIPT_PAYLOAD = "</script><script>alert(1)</script>"
SCRIPT_RUN = "evil" + SCRIPT_PAYLOAD


def synth_lines(
    run_id: str,
    n_iter: int = 400,
    n_req: int = 120,
    seed: int = 0,
    scale: float = 1.0,
    model: str = "toy-7b",
    req_prefix: str = "r",
    meta: dict | None = None,
) -> list[dict]:
    """A run: steps with t0 + a*ctx + b*prefill (+ noise, a few stalls), requests with token times."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(500, 20000, n_iter)
    prefill = np.where(rng.random(n_iter) < 0.2, rng.integers(100, 2000, n_iter), 0)
    dur_ms = (5 + 0.0003 * ctx + 0.02 * prefill) * rng.lognormal(0, 0.03, n_iter) * scale
    dur_ms[rng.random(n_iter) < 0.01] += 40 * scale
    t_end = 100.0 + np.cumsum(dur_ms) / 1000
    t_start = t_end - dur_ms / 1000
    lines: list[dict] = [
        {
            "kind": "run",
            "run_id": run_id,
            "engine": "synthetic",
            "model": model,
            "gpu": "H100",
            "clock": "monotonic",
            "meta": meta or {"note": "synthetic"},
        }
    ]
    for i in range(n_iter):
        lines.append(
            {
                "kind": "iteration",
                "iter": i,
                "t_start": float(t_start[i]),
                "t_end": float(t_end[i]),
                "prefill_tokens": int(prefill[i]),
                "prefill_reqs": int(prefill[i] > 0),
                "decode_tokens": 16,
                "decode_reqs": 16,
                "context_tokens": int(ctx[i]),
                "running_reqs": int(16 + (prefill[i] > 0)),
                "waiting_reqs": int(rng.integers(0, 5)),
                "kv_usage": float(ctx[i] / 40000),
            }
        )
    span = float(t_end[-1] - t_start[0])
    for k in range(n_req):
        arrival = 100.0 + span * k / n_req
        n_out = int(rng.integers(2, 40))
        ttft = rng.gamma(2.0, 40.0) * scale / 1000
        gaps = rng.gamma(2.0, 4.0, n_out - 1) * scale / 1000
        times = arrival + ttft + np.concatenate([[0.0], np.cumsum(gaps)])
        lines.append(
            {
                "kind": "request",
                "req_id": f"{req_prefix}{k}",
                "t_arrival": arrival,
                "t_scheduled": arrival + ttft / 4,
                "t_first_token": float(times[0]),
                "t_finish": float(times[-1]),
                "prompt_tokens": int(rng.integers(10, 2000)),
                "output_tokens": n_out,
                "token_times": times.tolist(),
            }
        )
    return lines


def ingest_lines(path, db_path, lines):
    from pipeline import ingest, store

    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    con = store.connect(db_path)
    ingest.ingest_paths(con, [path])
    store.build_derived(con)
    return con


@pytest.fixture
def synth_run(tmp_path, db_path):
    """(connection, run id) of a synthetic 400-step, 120-request run."""
    con = ingest_lines(tmp_path / "synth.jsonl", db_path, synth_lines("synth"))
    yield con, "synth"
    con.close()


@pytest.fixture
def hostile_run(tmp_path, db_path):
    """(connection, run id, strings) of a run whose id, model, request ids and metadata try to inject markup."""
    lines = synth_lines(
        HOSTILE_RUN,
        n_iter=60,
        n_req=30,
        model=HOSTILE_MODEL,
        req_prefix=HOSTILE_REQ,
        meta={"</script>": "<script>alert(3)</script>", "quote": "\"'`"},
    )
    con = ingest_lines(tmp_path / "hostile.jsonl", db_path, lines)
    yield con, HOSTILE_RUN, {"run": HOSTILE_RUN, "model": HOSTILE_MODEL, "req": HOSTILE_REQ}
    con.close()


def simulate_into(con, directory, run_id: str, seed: int) -> None:
    from pipeline import ingest
    from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

    trace = directory / f"{seed}.jsonl"
    run_simulation(
        trace,
        truth=False,
        run_id=run_id,
        spec=WorkloadSpec(requests=150, rate_rps=10.0, prompt_mean=300, output_mean=40),
        policy=Policy(max_num_seqs=32, max_num_batched_tokens=512, kv_capacity_tokens=100_000, chunked_prefill=True),
        model=IterationModel(t0_ms=5.0, a_ms_per_ctx=2e-4, b_ms_per_prefill=0.02, c_ms_per_decode=0.0),
        noise=NoiseModel(sigma=0.03, stall_rate=0.0, stall_ms_mean=0.0),
        seed=seed,
    )
    ingest.ingest_paths(con, [trace])


@pytest.fixture(scope="module")
def script_store(tmp_path_factory):
    """(connection, folder) of a store with simulated runs SCRIPT_RUN (replayable) and ``base``."""
    from pipeline import store

    d = tmp_path_factory.mktemp("hostile")
    con = store.connect(d / "s.duckdb")
    simulate_into(con, d, SCRIPT_RUN, 0)
    simulate_into(con, d, "base", 1)
    store.build_derived(con)
    yield con, d
    con.close()


def script_sweep_page(con, out):
    """The sweep chart page of a small sweep of the hostile run."""
    from pipeline.replay import calibrate, run_sweep
    from pipeline.report.sweep_chart import save_chart

    return save_chart(run_sweep(calibrate(con, SCRIPT_RUN), "max_num_batched_tokens", [256, 512], [0], None), out)
