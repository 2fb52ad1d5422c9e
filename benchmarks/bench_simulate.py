"""Benchmark the simulator: N engine steps, simulated and written as a canonical trace.

    python benchmarks/bench_simulate.py                      # 1M iterations, token times on
    python benchmarks/bench_simulate.py --iterations 200000 --no-token-times --out /tmp/b.jsonl.gz
    python benchmarks/bench_simulate.py --kv-block-size 16 --admit-full-prompt --kv-capacity-tokens 60000

Prints iterations/s of the event loop, the time of each phase, the total, the
trace size and the peak RSS of the process.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, build_workload, simulate  # noqa: E402
from pipeline.sim import _estimate_requests  # noqa: E402
from pipeline.sim.writer import write_trace, write_truth  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=20.0, help="requests/s")
    ap.add_argument("--out", default=None, help="trace path (default: a temporary file, deleted after)")
    ap.add_argument("--no-token-times", action="store_true")
    ap.add_argument("--stall-rate", type=float, default=0.001)
    ap.add_argument("--kv-capacity-tokens", type=int, default=200_000)
    ap.add_argument("--kv-block-size", type=int, default=1, help="KV block size in tokens (1: token-granular)")
    ap.add_argument("--admit-full-prompt", action="store_true", help="admit only when the whole prompt fits in KV")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    spec = WorkloadSpec(rate_rps=a.rate)
    policy = Policy(
        kv_capacity_tokens=a.kv_capacity_tokens, kv_block_size=a.kv_block_size, admit_full_prompt=a.admit_full_prompt
    )
    model, noise = IterationModel(), NoiseModel(stall_rate=a.stall_rate)
    tmp = None
    if a.out is None:
        tmp = tempfile.TemporaryDirectory()
        out = Path(tmp.name) / "bench.jsonl"
    else:
        out = Path(a.out)

    t0 = time.perf_counter()
    w = build_workload(spec, a.seed, _estimate_requests(spec, policy, model, a.iterations))
    t1 = time.perf_counter()
    r = simulate(w, policy, model, noise, a.seed, max_iterations=a.iterations)
    t2 = time.perf_counter()
    write_trace(r, out, "bench", policy, model, noise, w.describe(), with_token_times=not a.no_token_times)
    write_truth(out.with_suffix(".truth.json"), r, "bench", policy, model, noise, a.seed, w.describe(), out)
    t3 = time.perf_counter()

    size_mb = out.stat().st_size / 1e6
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ntok = int(r.requests["output_tokens"].sum())
    print(f"iterations        {r.n_iterations:,} (stop: {r.info['stop']})")
    print(
        f"requests          {r.n_requests:,} arrived of {len(w):,} generated; "
        f"{int((r.requests['status'] == 'ok').sum()):,} finished; "
        f"{int(r.iterations['preempted_reqs'].sum()):,} preemptions; ~{ntok:,} output tokens"
    )
    print(
        f"simulated time    {r.iterations['t_end'][-1]:,.1f} s; mean batch "
        f"{r.iterations['decode_reqs'].mean():.1f} decodes/step"
    )
    print(f"workload          {t1 - t0:7.2f} s")
    print(f"simulate          {t2 - t1:7.2f} s  ({r.n_iterations / (t2 - t1):,.0f} iterations/s)")
    print(f"write trace       {t3 - t2:7.2f} s  ({size_mb:,.1f} MB, token times {'off' if a.no_token_times else 'on'})")
    print(f"total             {t3 - t0:7.2f} s")
    print(f"peak RSS          {peak_mb:,.0f} MB")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    main()
