"""Stall detection against the simulator's truth, next to the best any per-step rule could do.

Usage:
    python benchmarks/bench_stalls.py [--seeds 3] [--sizes 30000,300000,1000000]   # FDR and recall by run size
    python benchmarks/bench_stalls.py --scheduled [--seeds 10] [--workload chat|prefill|both] [--k 4]

Default (by size): for each noise law (log-normal and Student-t with 3 df, 3% sd), stall rate
(0.05%, 0.5%, 2%; exponential stalls of mean 60 ms) and run size, steps with the compositions of
a scheduled chat run (resampled, fresh noise: ``pipeline.sim.scoring.resampled_steps``) are
fitted and judged by the FDR rule (``--fdr``, default 0.05) and by the old fixed k = 3.5 rule.
Pooled over the seeds: flagged, false-discovery rate, recall of all stalls and of the stalls above
the detection limit.

--scheduled, for each seed: simulate a steady load (3% log-normal noise, 2% of steps with an
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
    model = IterationModel(
        t0_ms=8.03e9 * 2 / peak * 1e3 + 2.0,
        a_ms_per_ctx=kv_bytes / (0.8 * peak) * 1e3,
        b_ms_per_prefill=0.032,
        c_ms_per_decode=0.0,
    )
    noise = NoiseModel(sigma=SIGMA, stall_rate=STALL_RATE, stall_ms_mean=STALL_MEAN_MS)
    policy = Policy(max_num_seqs=128, max_num_batched_tokens=2048)
    res = simulate(poisson_workload(3000, 20, prompt, 0.8, output, 0.8, seed=seed), policy, model, noise, seed=seed + 1)
    run = f"{workload}-{seed}"
    trace = write_trace(res, work / f"{run}.jsonl", run, policy, model, noise, with_token_times=False)
    con = store.connect(work / f"{run}.duckdb")
    ingest_paths(con, [trace])
    store.build_derived(con)
    f = fit_run(con, run, k=k, n_boot=20)
    rows = con.execute(
        "select iter, is_stall, predicted_ms from iteration_fit where run_id = ? order by iter", [run]
    ).fetchnumpy()
    con.close()
    it = res.iterations
    assert np.array_equal(rows["iter"], np.arange(len(it["stall_ms"])))
    limit = f.detection_limit_ms(rows["predicted_ms"])
    out = score_stalls(rows["is_stall"], it["stall_ms"], limit)
    y = (it["t_end"] - it["t_start"]) * 1000
    out.update(
        steps=len(y),
        oracle=oracle_recall(y, it["base_ms"], it["stall_ms"] > 0, noise),
        limit_p50_ms=float(np.median(limit)),
    )
    return out


def by_size(sizes: list[int], seeds: int, q: float) -> None:
    from pipeline.fit.model import fit_linear, log_ratio
    from pipeline.fit.stalls import limit_factor
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.scoring import resampled_steps
    from pipeline.sim.workload import poisson_workload

    kv_bytes, peak = 2 * 32 * 8 * 128 * 2, 3350e9
    model = IterationModel(
        t0_ms=8.03e9 * 2 / peak * 1e3 + 2.0,
        a_ms_per_ctx=kv_bytes / (0.8 * peak) * 1e3,
        b_ms_per_prefill=0.032,
        c_ms_per_decode=0.0,
    )
    tpl = simulate(
        poisson_workload(3000, 20, 300, 0.8, 400, 0.8, seed=1),
        Policy(max_num_seqs=128, max_num_batched_tokens=2048),
        model,
        NoiseModel(sigma=0.0),
        seed=1,
    ).iterations
    print(
        f"{'law':<10}{'steps':>9}{'rate':>7}{'rule':>7}{'stalls':>8}{'flagged':>9}{'false':>7}{'fdr':>7}"
        f"{'recall':>8}{'rec>lim':>8}{'lim p50 ms':>11}{'df':>6}{'s/fit':>7}"
    )
    for law in ("lognormal", "t"):
        for n in sizes:
            for rate in (0.0005, 0.005, 0.02):
                acc = {"fdr": np.zeros(6), "k3.5": np.zeros(6)}
                dfs, secs = [], 0.0
                for seed in range(seeds):
                    st = resampled_steps(
                        tpl, n, model, NoiseModel(sigma=SIGMA, stall_rate=rate, stall_ms_mean=60.0, law=law), seed
                    )
                    cols = {c: st[c].astype(float) for c in ("context_tokens", "prefill_tokens", "decode_tokens")}
                    for rule, k in (("fdr", None), ("k3.5", 3.5)):
                        t = time.perf_counter()
                        f = fit_linear(cols, st["iteration_ms"], n_boot=0, k=k, fdr=q)
                        if rule == "fdr":
                            secs += time.perf_counter() - t
                            dfs.append(f.stall_fdr["null"]["df"] or np.inf)
                        yhat = f.predict(cols)
                        flagged = log_ratio(st["iteration_ms"], yhat) > f.log_center + f.stall_k * f.log_scale
                        limit = yhat * limit_factor(f.log_center, f.stall_k, f.log_scale)
                        big = st["stall_ms"] > limit
                        acc[rule] += [
                            (st["stall_ms"] > 0).sum(),
                            flagged.sum(),
                            (flagged & (st["stall_ms"] == 0)).sum(),
                            (flagged & (st["stall_ms"] > 0)).sum(),
                            big.sum(),
                            (flagged & big).sum(),
                        ]
                        acc[rule + "_lim"] = float(np.median(limit))
                for rule in ("fdr", "k3.5"):
                    stalls, flg, false, found, big, found_big = acc[rule]
                    print(
                        f"{law:<10}{n:>9}{rate:>7.2%}{rule:>7}{stalls:>8.0f}{flg:>9.0f}{false:>7.0f}"
                        f"{false / max(flg, 1):>7.1%}{found / stalls:>8.1%}{found_big / max(big, 1):>8.1%}"
                        f"{acc[rule + '_lim']:>11.3g}"
                        + (f"{np.median(dfs):>6.3g}{secs / seeds:>7.2f}" if rule == "fdr" else ""),
                        flush=True,
                    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scheduled", action="store_true", help="end-to-end on scheduled runs (ingest, fit, store)")
    p.add_argument("--sizes", default="30000,300000,1000000")
    p.add_argument("--fdr", type=float, default=0.05)
    p.add_argument("--seeds", type=int, default=None, help="default 3 by size, 10 --scheduled")
    p.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both")
    p.add_argument("--k", type=float, default=None, help="fixed threshold in robust sigmas (default: the FDR rule)")
    o = p.parse_args()
    if not o.scheduled:
        by_size([int(x) for x in o.sizes.split(",")], o.seeds or 3, o.fdr)
        return
    o.seeds = o.seeds or 10
    k = o.k
    work = Path(tempfile.mkdtemp(prefix="bench_stalls_"))
    cols = ["steps", "stalls", "recall", "fdr", "recall_above_limit", "ms_recall", "oracle", "limit_p50_ms"]
    for wl in WORKLOADS if o.workload == "both" else [o.workload]:
        t = time.perf_counter()
        print(f"\nworkload {wl} (prompt/output mean {WORKLOADS[wl]}), " + (f"k = {k}" if k else "FDR 0.05"))
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
