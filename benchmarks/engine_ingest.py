"""Throughput of the vectorised vLLM log parser on a large synthetic log.

Writes N copies of the recorded fixture's Iteration lines (renumbered, epoch stamps
advancing by each step's elapsed time) interleaved with its other lines, then times
`tracelat ingest`.  Usage: python benchmarks/engine_ingest.py [N_STEPS]
"""

from __future__ import annotations

import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from pipeline import ingest, store

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "server_epoch.log"


def make_log(path: Path, n_steps: int) -> int:
    lines = FIX.read_text().splitlines()
    steps = [l for l in lines if "Iteration(" in l]
    other = [l for l in lines if "Iteration(" not in l][:50]
    t = 1.8e9
    with open(path, "w") as f:
        f.write("\n".join(other) + "\n")
        for i in range(n_steps):
            src = steps[i % len(steps)]
            dur = float(re.search(r"elapsed time: ([0-9.]+)", src).group(1))
            t += dur / 1000 + 0.0005
            body = re.sub(r"Iteration\(\d+\)", f"Iteration({i})", src.split(" ", 1)[1])
            f.write(f"{t:.6f} {body}\n")
            if i % 1000 == 0:
                f.write(f"{t:.6f} INFO [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s\n")
    return path.stat().st_size


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "big.log"
        size = make_log(log, n)
        con = store.connect(Path(d) / "b.duckdb")
        t0 = time.perf_counter()
        (res,) = ingest.ingest_paths(con, [log])
        dt = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n} steps, {size / 1e6:.0f} MB: {dt:.1f} s ({n / dt:,.0f} steps/s), peak RSS {peak:.0f} MiB; {res.line()}"
        )


if __name__ == "__main__":
    main()
