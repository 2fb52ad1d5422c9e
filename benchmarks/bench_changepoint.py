"""False-alarm rate, power and run time of the nightly change-point detector.

Usage:
    python benchmarks/bench_changepoint.py            # the figures in docs/nightly.md (~15 min on 2 cores)
    python benchmarks/bench_changepoint.py --quick    # a tenth of the histories

Synthetic histories of 30 nights whose truth is known: log-normal night-to-night noise
of spread sigma around 100, plus a 15% step at night 20 or a drift of 1% per night.
Prints, for the default :class:`pipeline.nightly.changepoint.Settings`:

* noise only (sigma 4%): histories with a change point in the 30-night history, and
  histories that raised one on some night when searched every night from 6 to 30;
* noise only, 20 independent statistics per history: histories with one anywhere;
* per sigma (2, 4, 6, 8%): the step found at night 20 +/- 1, the drift found;
* the time of one search of 30, 90, 180 and 365 nights, quiet and with a step.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.nightly.changepoint import Settings, detect

NIGHTS, STEP_AT = 30, 19


def noise(i: int, sigma: float, n: int = NIGHTS) -> np.ndarray:
    return 100 * np.exp(np.random.default_rng(10_000 + i).normal(0, sigma, n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the histories")
    k = 10 if ap.parse_args().quick else 1
    t = time.time()
    n = 1000 // k
    false = sum(bool(detect(noise(i, 0.04), Settings(seed=i))) for i in range(n))
    print(f"noise only, sigma 4%: {false} of {n} histories with a change point ({time.time() - t:.0f} s)")
    n = 300 // k
    ever = sum(any(detect(noise(i, 0.04)[:m], Settings(seed=i)) for m in range(6, NIGHTS + 1)) for i in range(n))
    print(f"noise only, searched every night 6..30: {ever} of {n} raised one on some night ({time.time() - t:.0f} s)")
    n, stats = 200 // k, 20
    anywhere = 0
    for h in range(n):
        rng = np.random.default_rng(50_000 + h)
        anywhere += any(
            [bool(detect(100 * np.exp(rng.normal(0, 0.04, NIGHTS)), Settings(seed=s))) for s in range(stats)]
        )
    print(
        f"noise only, {stats} independent statistics: {anywhere} of {n} histories raised one ({time.time() - t:.0f} s)"
    )
    step = np.where(np.arange(NIGHTS) >= STEP_AT, 1.15, 1.0)
    drift = 1.01 ** np.arange(NIGHTS)
    for sigma in (0.02, 0.04, 0.06, 0.08):
        n = 200 // k
        hit = sum(
            any(abs(c.index - STEP_AT) <= 1 for c in detect(noise(i, sigma) * step, Settings(seed=i))) for i in range(n)
        )
        found = sum(bool(detect(noise(i, sigma) * drift, Settings(seed=i))) for i in range(n))
        print(
            f"sigma {sigma:.0%}: 15% step at night 20 found at 20 +/- 1 in {hit} of {n}; "
            f"1%/night drift found in {found} of {n} ({time.time() - t:.0f} s)"
        )
    for nights in (30, 90, 180, 365):
        x = noise(nights, 0.04, nights)
        t0 = time.time()
        detect(x)
        quiet = time.time() - t0
        t0 = time.time()
        cps = detect(x * np.where(np.arange(nights) >= nights * 2 // 3, 1.15, 1.0))
        print(
            f"{nights} nights: one search {quiet:.2f} s quiet, {time.time() - t0:.2f} s with a 15% step "
            f"(found at {[c.index for c in cps]})"
        )


if __name__ == "__main__":
    main()
