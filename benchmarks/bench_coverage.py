"""Coverage of the fit's 95% intervals against the simulator's truth, with and without stalls.

Usage:
    python benchmarks/bench_coverage.py [--seeds 200] [--first-seed 0] [--stall-rate 0,0.01,0.02,0.05]
                                        [--stall-ms 80] [--requests 1000] [--procs 2] [--json OUT]

For each stall rate and seed: ``tracelat simulate``'s default run (1000 requests at 10 req/s,
prompts 512 / outputs 128 tokens, t0 = 5 ms, a = 2e-4, b = 0.02, c = 0 ms per token, 3%
log-normal noise: about 14k steps, so the intervals are the one-step bootstrap's) with
``--seed SEED --stall-rate R --stall-ms MS`` (exponential stalls of that mean), fitted as
``tracelat fit`` fits it (:func:`pipeline.fit.model.fit_linear`, 200 replicates, on the
simulator's own per-step columns: the trace holds the same numbers). Seed s simulates with
seed s, so a row is reproducible with ``tracelat simulate --seed s``.

Prints, per stall rate and coefficient, how often the interval holds the true value, with
the exact (Clopper-Pearson) binomial 95% interval of that coverage, and the mean relative
bias and interval width. At most ``--procs`` worker processes (default 2).
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

NAMES = ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode")


def one(args: tuple[int, float, float, int]) -> dict:
    """Simulate one seed, fit it; per coefficient: estimate, interval, truth."""
    seed, rate, stall_ms, requests = args
    from pipeline.fit.model import fit_linear
    from pipeline.sim import build_workload
    from pipeline.sim.config import Policy, WorkloadSpec
    from pipeline.sim.engine import simulate
    from pipeline.sim.model import IterationModel, NoiseModel

    model = IterationModel()
    noise = NoiseModel(stall_rate=rate, stall_ms_mean=stall_ms)
    res = simulate(build_workload(WorkloadSpec(), seed, requests), Policy(), model, noise, seed=seed)
    it = res.iterations
    cols = {c: it[c].astype(float) for c in ("context_tokens", "prefill_tokens", "decode_tokens")}
    y = (it["t_end"] - it["t_start"]) * 1000
    f = fit_linear(cols, y)
    truth = model.to_dict()
    out = {"seed": seed, "rate": rate, "n": len(y), "method": f.ci_method, "stalls": int((it["stall_ms"] > 0).sum())}
    for k in NAMES:
        if k in f.coef:
            out[k] = (f.coef[k], *f.ci[k], truth[k])
    return out


def table(rows: list[dict], rates: list[float], stall_ms: float) -> list[dict]:
    from scipy.stats import binomtest

    summary = []
    print(f"{'stalls':>7} {'coef':<17} {'covered':>9} {'coverage':>9} {'95% CI':>15} {'bias':>9} {'width':>9}")
    for rate in rates:
        sel = [r for r in rows if r["rate"] == rate]
        for k in NAMES:
            v = np.array([r[k] for r in sel if k in r])
            if not len(v):
                continue
            est, lo, hi, tr = v.T
            hit = int(np.sum((lo <= tr) & (tr <= hi)))
            ci = binomtest(hit, len(v), 0.95).proportion_ci(0.95)
            scale = np.where(tr != 0, np.abs(tr), 1.0)  # c = 0: absolute, in ms per token
            bias = float(np.mean((est - tr) / scale))
            width = float(np.mean((hi - lo) / scale))
            summary.append(
                {
                    "stall_rate": rate,
                    "stall_ms": stall_ms,
                    "coef": k,
                    "covered": hit,
                    "runs": len(v),
                    "coverage": hit / len(v),
                    "ci_low": ci.low,
                    "ci_high": ci.high,
                    "mean_bias": bias,
                    "mean_width": width,
                }
            )
            print(
                f"{rate:>7.2%} {k:<17} {hit:>4}/{len(v):<4} {hit / len(v):>9.1%} "
                f"{ci.low:>7.1%}-{ci.high:<6.1%} {bias:>+9.2e} {width:>9.2e}"
            )
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--stall-rate", default="0,0.01,0.02,0.05", help="comma-separated stall rates")
    ap.add_argument("--stall-ms", type=float, default=80.0, help="mean stall length (exponential), ms")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the per-run rows and the table here")
    o = ap.parse_args()
    rates = [float(x) for x in o.stall_rate.split(",")]
    jobs = [(s, r, o.stall_ms, o.requests) for r in rates for s in range(o.first_seed, o.first_seed + o.seeds)]
    t = time.perf_counter()
    with Pool(min(o.procs, 2)) as pool:
        rows = pool.map(one, jobs, chunksize=4)
    steps = np.mean([r["n"] for r in rows])
    print(
        f"{len(rows)} runs ({o.seeds} seeds x {len(rates)} stall rates, stalls of mean {o.stall_ms:g} ms), "
        f"{steps:.0f} steps on average, {rows[0]['method']}; {time.perf_counter() - t:.0f} s"
    )
    summary = table(rows, rates, o.stall_ms)
    if o.json:
        o.json.write_text(json.dumps({"args": vars(o) | {"json": str(o.json)}, "rows": rows, "table": summary}))


if __name__ == "__main__":
    main()
