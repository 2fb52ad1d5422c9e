"""Stall detection against the simulator's truth, next to the best any per-step rule could do.

Usage:
    python benchmarks/bench_stalls.py [--seeds 10] [--workload chat|prefill|both] [--k 4]

For each seed: simulate a steady load (3% log-normal noise, 2% of steps with an
injected stall of exponential length, mean 50 ms), ingest it, fit it, and compare
the steps tracelat flags as stalls with the injected ones:

- ``recall``: found / injected (all injected stalls, however small);
- ``fdr``: flagged steps without an injected stall / flagged steps;
- ``recall_above_limit``: recall over stalls larger than the fit's own detection limit at
  their step (``FitResult.detection_limit_ms``);
- ``ms_recall``: injected stall time in found stalls / all injected stall time;
- ``oracle``: what the best rule judging one step at a time could reach at <= 5%
  false discoveries, told the truth the fit has to estimate
  (``pipeline.sim.scoring.oracle_recall``). Small stalls sit inside the noise of
  their step: when the oracle misses them, so must any detector.

Workloads: ``chat`` (prompts 300, outputs 400 tokens on average: decode-dominated
steps) and ``prefill`` (prompts 800, outputs 200: long chunked-prefill steps, whose
3% noise hides larger stalls). Prints one row per seed and the min/mean per column.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

WORKLOADS = {"chat": (300, 400), "prefill": (800, 200)}
SIGMA, STALL_RATE, STALL_MEAN_MS = 0.03, 0.02, 50.0


def one(workload: str, seed: int, k: float, work: Path) -> dict[str, float]:
    from pipeline import store
    from pipeline.fit import fit_run
    from pipeline.ingest import ingest_paths
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.scoring import oracle_recall, score_stalls
    from pipeline.sim.workload import poisson_workload
    from pipeline.sim.writer import write_trace

    prompt, output = WORKLOADS[workload]
    # Llama-3.1-8B on an H100 SXM (3350 GB/s): t0 = weight read at peak + 2 ms, a = KV read at 80% of peak
    kv_bytes, peak = 2 * 32 * 8 * 128 * 2, 3350e9
    model = IterationModel(8.03e9 * 2 / peak * 1e3 + 2.0, kv_bytes / (0.8 * peak) * 1e3, 0.032, 0.0)
    noise, policy = NoiseModel(SIGMA, STALL_RATE, STALL_MEAN_MS), Policy(128, 2048)
    res = simulate(poisson_workload(3000, 20, prompt, 0.8, output, 0.8, seed=seed), policy, model, noise, seed=seed + 1)
    run = f"{workload}-{seed}"
    trace = write_trace(res, work / f"{run}.jsonl", run, policy, model, noise, with_token_times=False)
    con = store.connect(work / f"{run}.duckdb")
    ingest_paths(con, [trace])
    store.build_derived(con)
    f = fit_run(con, run, k=k, n_boot=20)
    rows = con.execute("select iter, is_stall, predicted_ms from iteration_fit where run_id = ? order by iter",
                       [run]).fetchnumpy()
    con.close()
    it = res.iterations
    assert np.array_equal(rows["iter"], np.arange(len(it["stall_ms"])))
    limit = f.detection_limit_ms(rows["predicted_ms"])
    out = score_stalls(rows["is_stall"], it["stall_ms"], limit)
    y = (it["t_end"] - it["t_start"]) * 1000
    out.update(steps=len(y), oracle=oracle_recall(y, it["base_ms"], it["stall_ms"] > 0, noise),
               limit_p50_ms=float(np.median(limit)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both")
    p.add_argument("--k", type=float, default=None, help="threshold in robust sigmas (default: tracelat's)")
    o = p.parse_args()
    from pipeline.fit.stalls import DEFAULT_K

    k = DEFAULT_K if o.k is None else o.k
    work = Path(tempfile.mkdtemp(prefix="bench_stalls_"))
    cols = ["steps", "stalls", "recall", "fdr", "recall_above_limit", "ms_recall", "oracle", "limit_p50_ms"]
    for wl in WORKLOADS if o.workload == "both" else [o.workload]:
        t = time.perf_counter()
        print(f"\nworkload {wl} (prompt/output mean {WORKLOADS[wl]}), k = {k}")
        print("seed " + " ".join(f"{c[:12]:>12}" for c in cols))
        table = []
        for seed in range(1, o.seeds + 1):
            r = one(wl, seed, k, work)
            table.append([r[c] for c in cols])
            print(f"{seed:>4} " + " ".join(f"{v:>12.4g}" for v in table[-1]))
        a = np.array(table, dtype=float)
        print(" min " + " ".join(f"{v:>12.4g}" for v in a.min(axis=0)))
        print("mean " + " ".join(f"{v:>12.4g}" for v in a.mean(axis=0)))
        print(f"({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
