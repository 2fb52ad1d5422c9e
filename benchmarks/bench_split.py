"""Split evidence with known truth: how well a run joined from two files on two clocks matches the same run in one file.

For each load (light, a head-of-line incident, KV pressure with preemptions) and seed,
a simulated run is written once as a single canonical file and once split into a
server file (steps, unix clock, no request ids) and a client file (arrival, first
token, finish and token times only, on a perf_counter-like clock); both are ingested
and compared.  ``--engine`` writes the split as a vLLM default-format log (1-second
stamps) plus an AIPerf export instead.

    python benchmarks/bench_split.py --seeds 10
    python benchmarks/bench_split.py --seeds 5 --engine

Columns: offset error in median steps, TTFT/TPOT/E2E percentile differences (ms, the
largest of p50/p90/p99), duration difference, queue_ms p50/p99 relative error,
the largest tail-share difference (points) and whether the top cause agrees.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import store  # noqa: E402
from pipeline.ingest import ingest_paths  # noqa: E402


def pct(con, run: str, col: str) -> np.ndarray:
    v = con.execute(
        f"select {col} from request_latency where run_id = ? and status = 'ok' and {col} is not null", [run]
    ).fetchnumpy()[col]
    return np.percentile(v, [50, 90, 99])


def shares(con, run: str, metric: str):
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain

    get_or_fit(con, run)
    e = explain(con, run, metric)
    return e["largest"], {p["part"]: p["share"] for p in e["parts"]}


def one(kind: str, seed: int, engine: bool) -> dict:
    from pipeline.sim.split import scenario, write_engine_pair, write_split
    from pipeline.sim.writer import write_trace

    result, pol, model, noise = scenario(kind, seed)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        single = write_trace(result, tmp / "single.jsonl", "single", pol, model, noise)
        if engine:
            truth = write_engine_pair(result, tmp / "server.log", tmp / "profile_export.jsonl")
            files = [tmp / "server.log", tmp / "profile_export.jsonl"]
        else:
            truth = write_split(
                result,
                tmp / "server.jsonl",
                tmp / "client.jsonl",
                "split",
                pol,
                model,
                noise,
                client_origin_s=600.0 + 7919.0 * seed,
            )
            files = [tmp / "server.jsonl", tmp / "client.jsonl"]
        con = store.connect(tmp / "b.duckdb")
        ingest_paths(con, [single])
        t0 = time.perf_counter()
        ingest_paths(con, files, run_id="split")
        t_ingest = time.perf_counter() - t0
        store.build_derived(con)
        src = json.loads(
            con.execute(
                "select json_extract(meta, '$.clock_alignment.sources[0]') from runs where run_id = 'split'"
            ).fetchone()[0]
        )
        med = float(np.median(result.iterations["t_end"] - result.iterations["t_start"]))
        lat = max(
            float(np.max(np.abs(pct(con, "split", m) - pct(con, "single", m))))
            for m in ("ttft_ms", "tpot_ms", "e2e_ms")
        )
        dur = dict(con.execute("select run_id, duration_s from run_summary").fetchall())
        qa, qb = pct(con, "single", "queue_ms"), pct(con, "split", "queue_ms")
        share_diff, top_ok = 0.0, True
        for metric in ("ttft", "tpot"):
            ta, sa = shares(con, "single", metric)
            tb, sb = shares(con, "split", metric)
            top_ok &= ta == tb
            share_diff = max(share_diff, max(abs(sa.get(k, 0.0) - sb.get(k, 0.0)) for k in set(sa) | set(sb)))
        con.close()
    return {
        "kind": kind,
        "seed": seed,
        "status": src["status"],
        "offset_err_steps": (src["offset_s"] - truth) / med,
        "lat_diff_ms": lat,
        "dur_rel": dur["split"] / dur["single"] - 1,
        "q50_rel": qb[0] / qa[0] - 1 if qa[0] else float("nan"),
        "q99_rel": qb[2] / qa[2] - 1 if qa[2] else float("nan"),
        "share_diff_pts": 100 * share_diff,
        "top_cause_same": top_ok,
        "ingest_s": t_ingest,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--engine", action="store_true", help="vLLM default log + AIPerf export instead of canonical files")
    ap.add_argument("--kinds", default="light,incident,kv")
    args = ap.parse_args()
    cols = (
        "kind",
        "seed",
        "status",
        "offset_err_steps",
        "lat_diff_ms",
        "dur_rel",
        "q50_rel",
        "q99_rel",
        "share_diff_pts",
        "top_cause_same",
        "ingest_s",
    )
    print(" ".join(f"{c:>16}" for c in cols))
    for kind in args.kinds.split(","):
        for seed in range(args.seeds):
            r = one(kind, seed + 2, args.engine)
            print(
                " ".join(f"{r[c]:>16.4f}" if isinstance(r[c], float) else f"{str(r[c]):>16}" for c in cols), flush=True
            )


if __name__ == "__main__":
    main()
