"""How often `tracelat compare` flags re-runs of one simulated load (the false-flag rate per statistic).

Usage:
  python benchmarks/compare_reruns.py                     # 8 pairs of 600 requests at 8 req/s
  python benchmarks/compare_reruns.py --pairs 20 --requests 1000 --rate 10 --confidence 0.99

Each pair is two ``tracelat simulate`` runs of the same configuration with different seeds
(seed 2i+1 and 2i+2): the same load, drawn again, as a nightly job re-running one build sees
it. Every flag (regression or improvement) is a false one. Prints, per statistic, how many
pairs flagged it, and how many pairs flagged anything (what a nightly gate would see).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import ingest, store  # noqa: E402
from pipeline.compare import compare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--confidence", type=float, default=0.99)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        traces = []
        for seed in range(1, 2 * a.pairs + 1):
            out = Path(d) / f"s{seed}.jsonl"
            cmd = [sys.executable, "-m", "pipeline", "simulate", "--requests", str(a.requests), "--rate", str(a.rate)]
            cmd += ["--seed", str(seed), "--run-id", f"s{seed}", "--out", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            traces.append(out)
        con = store.connect(Path(d) / "s.duckdb")
        ingest.ingest_paths(con, traces)
        store.build_derived(con)
        flags: Counter = Counter()
        any_flag, compared = 0, Counter()
        for i in range(1, 2 * a.pairs + 1, 2):
            comp = compare(con, f"s{i}", con, f"s{i + 1}", confidence=a.confidence)
            flagged = [d for d in comp.deltas if d.verdict != "no significant change"]
            any_flag += bool(flagged)
            compared.update(f"{d.metric}.{d.stat}" for d in comp.deltas)
            flags.update(f"{d.metric}.{d.stat}" for d in flagged)
        con.close()
    print(f"{a.pairs} pairs of re-runs ({a.requests} requests at {a.rate:g} req/s), confidence {a.confidence:g}")
    print(f"pairs with any flag: {any_flag} of {a.pairs}")
    print(f"flags expected per statistic at this confidence: {a.pairs * (1 - a.confidence):.2f}")
    for name in sorted(compared):
        print(f"  {name:40s} {flags[name]} of {compared[name]}")


if __name__ == "__main__":
    main()
