"""How often the steady-rate interval covers a known load's true rate (docs/metrics.md, "Uncertainty").

Usage:
  python benchmarks/steady_interval_coverage.py                      # 40 runs, requests ~5 s long
  python benchmarks/steady_interval_coverage.py --runs 100 --mean-out 40 --gap-s 0.01

Each run: Poisson arrivals at --rate, output lengths uniform on 1..2*mean-1 (mean exactly
--mean-out), tokens --gap-s apart, so the true steady output rate is rate * mean-out. Prints the
95% coverage of the interval with and without the edge allowance, the mean SE against the runs'
real scatter, the mean lag-1 autocorrelation, and how many runs reached a steady state.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.stats import t as student_t

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import ingest, steady, store  # noqa: E402


def write_runs(path: Path, runs: int, n: int, rate: float, mean_out: int, gap_s: float, seed: int) -> None:
    with path.open("w") as f:
        for i in range(runs):
            rng = np.random.default_rng(seed + i)
            arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))])
            out = rng.integers(1, 2 * mean_out, n)
            f.write(json.dumps({"kind": "run", "run_id": f"p{i}", "engine": "hand"}) + "\n")
            for j, (a, m) in enumerate(zip(arrival, out)):
                tt = a + 0.05 + gap_s * np.arange(m)
                rec = {"kind": "request", "run_id": f"p{i}", "req_id": f"r{j}", "t_arrival": float(a)}
                rec |= {"t_first_token": float(tt[0]), "t_finish": float(tt[-1]), "prompt_tokens": 16}
                rec |= {"output_tokens": int(m), "token_times": tt.tolist()}
                f.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--mean-out", type=int, default=100)
    ap.add_argument("--gap-s", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1000)
    a = ap.parse_args()
    truth = a.rate * a.mean_out
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "runs.jsonl"
        write_runs(trace, a.runs, a.requests, a.rate, a.mean_out, a.gap_s, a.seed)
        con = store.connect(Path(d) / "s.duckdb")
        ingest.ingest_paths(con, [trace])
        store.build_derived(con)
        rows, unreached, no_interval = [], 0, 0
        for i in range(a.runs):
            st = steady.section(con, f"p{i}")["steady_state"]
            if not st["reached"]:
                unreached += 1
                continue
            u = st["uncertainty"]
            if u["output_tokens_per_s_se"] is None:
                no_interval += 1
                continue
            q = student_t.ppf(0.975, u["windows"] - 1)
            v, se, edge = st["steady_output_tokens_per_s"], u["output_tokens_per_s_se"], u["output_tokens_per_s_edge"]
            rows.append(
                (abs(v - truth) <= q * se + edge, abs(v - truth) <= q * se, se, v - truth, u["lag1_autocorrelation"])
            )
        con.close()
    r = np.array(rows, dtype=float)
    print(f"{a.runs} runs: {len(r)} with an interval, {unreached} without a steady state, {no_interval} too short")
    print(
        f"95% coverage with the edge allowance {int(r[:, 0].sum())}/{len(r)}, without it {int(r[:, 1].sum())}/{len(r)}"
    )
    print(
        f"mean SE {r[:, 2].mean():.2f} tokens/s against the runs' scatter {r[:, 3].std(ddof=1):.2f} (sd of rate - truth)"
    )
    print(
        f"mean bias {r[:, 3].mean() / truth:+.2%} of the true rate {truth:g}; mean lag-1 autocorrelation {r[:, 4].mean():.2f}"
    )


if __name__ == "__main__":
    main()
