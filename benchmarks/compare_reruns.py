"""How often `tracelat compare` flags re-runs of one simulated load (the false-flag rate per statistic).

Usage:
  python benchmarks/compare_reruns.py                       # 20 pairs of 800 requests at 12 req/s
  python benchmarks/compare_reruns.py --pairs 30 --requests 600 --rate 8
  python benchmarks/compare_reruns.py --slower 0.1          # candidates' step cost 10% higher: power
  python benchmarks/compare_reruns.py --residence-multiple 1,2,4   # block lengths side by side
  python benchmarks/compare_reruns.py --same-arrivals       # each pair serves one workload: paired

Each pair is two simulated runs of the same configuration with different seeds: the same
load, drawn again, as a nightly job re-running one build sees it. Every flag (regression or
improvement) is a false one, unless ``--slower`` makes the candidates' fixed step cost
higher (then flags on TPOT, ITL and step times are the ones wanted). Prints, per statistic,
how many pairs flagged it of how many had an interval, how many pairs flagged anything
(what a nightly gate would see), and the root mean square of ``delta / (half-width / z)``
(z = 2.576 at 99%) over every tested latency statistic (near 1 when the intervals are as
wide as the re-runs' scatter calls for).
``--same-arrivals``: the two runs of a pair serve the same arrivals (drawn from the baseline's
seed) and differ only in their steps' noise, as a replay or a re-run of one seeded benchmark
does; compare then resamples them in the same blocks (``compare.paired_blocks``), and the
script prints the same pairs resampled independently (``paired=False``) beside it.
``--residence-multiple`` sets ``BlockRule.residence_multiple``; a tiny one (0.01) cuts a run
into about as many blocks as ``max_blocks`` allows, close to resampling single requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import compare as cmp  # noqa: E402
from pipeline import ingest, store  # noqa: E402
from pipeline.sim import IterationModel, WorkloadSpec, run_simulation  # noqa: E402


def simulate_pairs(
    folder: Path, pairs: int, requests: int, rate: float, slower: float = 0.0, same_arrivals: bool = False
) -> Path:
    """A store holding runs s1..s{2 pairs}; odd seeds are baselines, even ones candidates
    (with ``same_arrivals``, a candidate serves its baseline's workload)."""
    from pipeline.sim import build_workload

    traces = []
    for seed in range(1, 2 * pairs + 1):
        out = folder / f"s{seed}.jsonl"
        t0 = IterationModel().t0_ms * (1 + slower * (seed % 2 == 0))
        spec = WorkloadSpec(requests=requests, rate_rps=rate)
        w = build_workload(spec, seed - (seed % 2 == 0)) if same_arrivals else None
        run_simulation(
            out, truth=False, run_id=f"s{seed}", seed=seed, spec=spec, workload=w, model=IterationModel(t0_ms=t0)
        )
        traces.append(out)
    db = folder / "s.duckdb"
    con = store.connect(db)
    ingest.ingest_paths(con, traces)
    store.build_derived(con)
    con.close()
    return db


def flag_counts(db: Path, pairs: int, confidence: float, paired: bool = True) -> dict:
    """Per statistic: flagged and tested pairs; pairs with any flag; the z-scores of the tested."""
    from scipy.stats import norm

    z_q = float(norm.ppf(0.5 + confidence / 2))
    con = store.connect(db, read_only=True)
    flags: Counter = Counter()
    tested: Counter = Counter()
    any_flag, zs, blocks, n_paired = 0, [], [], 0
    for i in range(1, 2 * pairs + 1, 2):
        comp = cmp.compare(con, f"s{i}", con, f"s{i + 1}", confidence=confidence, seed=i, paired=paired)
        n_paired += comp.paired is not None
        blocks += [comp.blocks["baseline"]["blocks"], comp.blocks["candidate"]["blocks"]]
        latency = [d for d in comp.deltas if d.metric != "throughput" and d.ci_low is not None]
        flagged = [d for d in comp.deltas if d.flagged]
        any_flag += bool(flagged)
        tested.update(f"{d.metric}.{d.stat}" for d in comp.deltas if d.ci_low is not None)
        flags.update(f"{d.metric}.{d.stat}" for d in flagged)
        # the CI's half-width in normal sd (2.576 at 99%)
        zs += [d.delta / ((d.ci_high - d.ci_low) / (2 * z_q)) for d in latency if d.ci_high > d.ci_low]
    con.close()
    return {
        "flags": flags,
        "tested": tested,
        "any": any_flag,
        "z_rms": float(np.sqrt(np.mean(np.square(zs)))),
        "blocks": float(np.median(blocks)),
        "paired": n_paired,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--rate", type=float, default=12.0)
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--slower", type=float, default=0.0, help="candidates' fixed step cost this much higher")
    ap.add_argument("--residence-multiple", default=str(cmp.BLOCKS.residence_multiple))
    ap.add_argument("--same-arrivals", action="store_true", help="each pair serves one workload (paired)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        db = simulate_pairs(Path(d), a.pairs, a.requests, a.rate, a.slower, a.same_arrivals)
        print(
            f"{a.pairs} pairs ({a.requests} requests at {a.rate:g} req/s), confidence {a.confidence:g}, "
            f"candidates {a.slower:+.0%} step cost{', same arrivals' if a.same_arrivals else ''}"
        )
        default = cmp.BLOCKS
        for mult in (float(x) for x in a.residence_multiple.split(",")):
            cmp.BLOCKS = dataclasses.replace(default, residence_multiple=mult)
            for paired in (True, False) if a.same_arrivals else (True,):
                r = flag_counts(db, a.pairs, a.confidence, paired)
                n_flags, n_tested = sum(r["flags"].values()), sum(r["tested"].values())
                how = f"{r['paired']} pairs paired" if paired else "resampled independently"
                print(
                    f"\nblocks of {mult:g} residence times (median {r['blocks']:g} blocks a run), {how}: "
                    f"{n_flags} flags of {n_tested} tested statistics ({n_flags / n_tested:.1%}); "
                    f"pairs with any flag: {r['any']} of {a.pairs}; rms z {r['z_rms']:.2f}"
                )
                for name in sorted(r["tested"]):
                    print(f"  {name:40s} {r['flags'][name]} of {r['tested'][name]}")
        cmp.BLOCKS = default


if __name__ == "__main__":
    main()
