"""Time the model fit and the attribution on a large simulated run.

Usage: python benchmarks/bench_fit.py [--requests 40000] [--no-token-times] [--workdir DIR]

Simulates a steady load (3% noise, 0.5% stalls) with per-token times, ingests it,
then times separately: the robust fit with 200 bootstrap replicates (numpy/scipy),
materialising iteration_fit + request_attribution (DuckDB as-of joins), and one
`explain` per metric. Prints the accuracy against the simulator's truth too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--no-token-times", action="store_true")
    ap.add_argument("--workdir", type=Path)
    o = ap.parse_args()

    import numpy as np

    from pipeline import store
    from pipeline.fit import explain, fit_run
    from pipeline.fit.model import fit_linear
    from pipeline.ingest import ingest_paths
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.workload import poisson_workload
    from pipeline.sim.writer import write_trace

    work = o.workdir or Path(tempfile.mkdtemp(prefix="bench_fit_"))
    model, noise, policy = IterationModel(6.8, 4.9e-5, 0.032, 0.0), NoiseModel(0.03, 0.005, 50.0), Policy(256, 4096)
    t = time.perf_counter()
    res = simulate(poisson_workload(o.requests, 40, 800, 0.8, 200, 0.8, seed=1), policy, model, noise, seed=2)
    trace = write_trace(res, work / "big.jsonl", "big", policy, model, noise, model_name="llama-3.1-8b",
                        gpu="h100-sxm", with_token_times=not o.no_token_times)
    print(f"simulate + write: {time.perf_counter() - t:.1f} s, {res.n_iterations} steps, {res.n_requests} requests")
    con = store.connect(work / "big.duckdb")
    t = time.perf_counter()
    ingest_paths(con, [trace])
    store.build_derived(con)
    print(f"ingest: {time.perf_counter() - t:.1f} s")

    it = res.iterations
    cols = {c: it[c].astype(float) for c in ("context_tokens", "prefill_tokens", "decode_tokens")}
    y = (it["t_end"] - it["t_start"]) * 1000
    t = time.perf_counter()
    fit_linear(cols, y, n_boot=200)
    print(f"robust fit + 200 bootstrap replicates (numpy/scipy only): {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    f = fit_run(con, "big")
    print(f"fit_run (fit, phases, iteration_fit, request_attribution, store): {time.perf_counter() - t:.2f} s")
    for metric in ("ttft", "tpot", "e2e"):
        t = time.perf_counter()
        e = explain(con, "big", metric)
        print(f"explain {metric}: {time.perf_counter() - t:.2f} s, largest part {e['largest']}")
    err = {k: getattr(f, k) / getattr(model, k) - 1 for k in ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill")}
    truth = set(np.flatnonzero(it["stall_ms"] > 0).tolist())
    found = {r[0] for r in con.execute("select iter from iteration_fit where is_stall").fetchall()}
    print("relative errors: " + ", ".join(f"{k} {v:+.4f}" for k, v in err.items()))
    print(f"stalls: {len(truth)} injected, {len(found)} found, recall {len(truth & found) / max(len(truth), 1):.3f}, "
          f"false positives {len(found - truth)}")


if __name__ == "__main__":
    main()
