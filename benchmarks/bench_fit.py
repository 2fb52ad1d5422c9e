"""Time the model fit and the attribution on a large simulated run.

Usage:
    python benchmarks/bench_fit.py [--requests 40000] [--no-token-times] [--workdir DIR]
    python benchmarks/bench_fit.py --iterations 1000000 [--workdir DIR]   # the 1M-step figures

Default: simulates a steady load (3% noise, 0.5% stalls) with per-token times in
this process, ingests it, then times the robust fit alone (numpy), ``fit_run``
and one ``explain`` per metric, with the accuracy against the simulator's truth.

``--iterations N``: makes the run with the CLI in child processes (``tracelat
simulate --iterations N --seed 1`` with 0.5% stalls, then ``tracelat ingest``; reused
if the workdir already holds it), so that this process's peak RSS is the fit's.
Prints the time of each phase of the first ``fit_run`` (what the first ``summary``
pays), the summary's fit/spikes/tail sections, ``explain`` per metric, and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def big(iterations: int, work: Path) -> None:
    """The 1M-step benchmark: every phase of the first fit, then the cached paths."""
    trace, db, truth = work / "bench.jsonl", work / "bench.duckdb", work / "bench.truth.json"
    pristine = work / "bench.pristine.duckdb"
    cli = [sys.executable, "-m", "pipeline"]
    if not pristine.exists():
        t = time.perf_counter()
        subprocess.run(
            cli
            + [
                "simulate",
                "--out",
                str(trace),
                "--run-id",
                "bench",
                "--iterations",
                str(iterations),
                "--seed",
                "1",
                "--stall-rate",
                "0.005",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(cli + ["ingest", str(trace), "--db", str(pristine)], check=True, stdout=subprocess.DEVNULL)
        print(f"simulate + ingest (child processes): {time.perf_counter() - t:.1f} s")
    shutil.copyfile(pristine, db)  # every run starts without a stored fit

    import numpy as np

    from pipeline import store
    from pipeline.fit import explain, fit_run
    from pipeline.fit.stalls import stall_iters
    from pipeline.fit.summary import sections

    con = store.open_for_reading(db)
    n = con.execute("select count(*) from iteration_metrics").fetchall()[0][0]
    ntok = con.execute("select count(*) from tokens").fetchall()[0][0]
    print(f"run: {n:,} steps, {ntok:,} token times; peak RSS before the fit {_peak_rss_mb():.0f} MB")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    f = fit_run(con, "bench", timings=timings)
    total = time.perf_counter() - t
    for name, s in timings.items():
        print(f"  {name:<26} {s:6.2f} s")
    print(f"fit_run (first fit, all phases): {total:.2f} s, ci method: {f.ci_method}; peak RSS {_peak_rss_mb():.0f} MB")
    t = time.perf_counter()
    sections(con, "bench")
    print(f"summary fit/spikes/tail sections (stored fit): {time.perf_counter() - t:.2f} s")
    for metric in ("ttft", "tpot", "e2e"):
        t = time.perf_counter()
        e = explain(con, "bench", metric)
        print(f"explain {metric}: {time.perf_counter() - t:.2f} s, largest part {e['largest']}")
    print(f"peak RSS (whole process) {_peak_rss_mb():.0f} MB")
    tr = json.loads(truth.read_text()) if truth.exists() else None
    if tr:
        m = tr["model"]
        print(
            "truth vs fit: "
            + ", ".join(
                f"{k} {getattr(f, k):.6g} [{f.ci[k][0]:.6g} .. {f.ci[k][1]:.6g}] (truth {m[k]:g})"
                for k in ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode")
                if getattr(f, k) is not None
            )
        )
        injected = {int(s["iter"]) for s in tr.get("stalls", [])} if tr.get("stalls") else set()
        found = stall_iters(con, "bench")
        if injected:
            print(
                f"stalls: {len(injected)} injected, {len(found)} found, recall "
                f"{len(injected & found) / len(injected):.3f}, false positives {len(found - injected)}"
            )
    del np


def small(o: argparse.Namespace) -> None:
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
    model = IterationModel(t0_ms=6.8, a_ms_per_ctx=4.9e-5, b_ms_per_prefill=0.032, c_ms_per_decode=0.0)
    noise = NoiseModel(sigma=0.03, stall_rate=0.005, stall_ms_mean=50.0)
    policy = Policy(max_num_seqs=256, max_num_batched_tokens=4096)
    t = time.perf_counter()
    res = simulate(poisson_workload(o.requests, 40, 800, 0.8, 200, 0.8, seed=1), policy, model, noise, seed=2)
    trace = write_trace(
        res,
        work / "big.jsonl",
        "big",
        policy,
        model,
        noise,
        model_name="llama-3.1-8b",
        gpu="h100-sxm",
        with_token_times=not o.no_token_times,
    )
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
    lf = fit_linear(cols, y, n_boot=200)
    print(f"robust fit + intervals (numpy only): {time.perf_counter() - t:.2f} s ({lf.ci_method})")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    f = fit_run(con, "big", timings=timings)
    print(f"fit_run (fit, phases, iteration_fit, request_attribution, store): {time.perf_counter() - t:.2f} s")
    print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    for metric in ("ttft", "tpot", "e2e"):
        t = time.perf_counter()
        e = explain(con, "big", metric)
        print(f"explain {metric}: {time.perf_counter() - t:.2f} s, largest part {e['largest']}")
    err = {k: getattr(f, k) / getattr(model, k) - 1 for k in ("t0_ms", "a_ms_per_ctx", "b_ms_per_prefill")}
    truth = set(np.flatnonzero(it["stall_ms"] > 0).tolist())
    found = {r[0] for r in con.execute("select iter from iteration_fit where is_stall").fetchall()}
    print("relative errors: " + ", ".join(f"{k} {v:+.4f}" for k, v in err.items()))
    print(
        f"stalls: {len(truth)} injected, {len(found)} found, recall {len(truth & found) / max(len(truth), 1):.3f}, "
        f"false positives {len(found - truth)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--no-token-times", action="store_true")
    ap.add_argument("--iterations", type=int, help="benchmark a run of this many steps made by the CLI")
    ap.add_argument("--workdir", type=Path)
    o = ap.parse_args()
    if o.iterations:
        work = o.workdir or Path(tempfile.mkdtemp(prefix="bench_fit_"))
        work.mkdir(parents=True, exist_ok=True)
        big(o.iterations, work)
    else:
        small(o)


if __name__ == "__main__":
    main()
