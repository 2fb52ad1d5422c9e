"""vLLM server log ingest against its floor: DuckDB reading the same file's lines and extracting the fields.

Writes a vLLM log of N ``Iteration(N):`` steps in vLLM's default format (1-second
stamps, start-up noise in front) and measures, each in its own process:

* ``floor``: ``create table t as select regexp_extract(...) ... from read_csv(FILE,
  columns={'raw': 'VARCHAR'}, ...)`` with every field tracelat keeps (DuckDB's own
  parallel reader and vectorised regular expressions; no timeline rebuild, no checks);
* ``ingest``: ``tracelat ingest FILE`` into a fresh store (parse, checks, timeline
  rebuild from the 1-second stamps, rejects, store), without derived tables.

    python benchmarks/bench_vllm_log.py                  # 1M steps
    python benchmarks/bench_vllm_log.py --steps 200000   # quick
    python benchmarks/bench_vllm_log.py --repeat 3       # fastest of three rounds each

Prints wall time and peak RSS of each and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOOR = r"""
import duckdb, sys
con = duckdb.connect(sys.argv[2])
con.execute("set enable_progress_bar = false")  # as in tracelat
con.execute('''create table t as select
  regexp_extract(raw, 'Iteration\((\d+)\):', 1)::bigint as iter,
  regexp_extract(raw, '(\d+) context requests', 1)::bigint as prefill_reqs,
  regexp_extract(raw, '(\d+) context tokens', 1)::bigint as prefill_tokens,
  regexp_extract(raw, '(\d+) generation requests', 1)::bigint as decode_reqs,
  regexp_extract(raw, '(\d+) generation tokens', 1)::bigint as decode_tokens,
  regexp_extract(raw, 'iteration elapsed time: ([0-9.]+) ms', 1)::double as dur_ms,
  regexp_extract(raw, 'KV cache usage: ([0-9.]+)%', 1)::double / 100 as kv_usage,
  strptime('2026-' || regexp_extract(raw, '^\w+ (\d\d-\d\d \d\d:\d\d:\d\d)', 1), '%Y-%m-%d %H:%M:%S') as stamp
from read_csv(?, columns={'raw': 'VARCHAR'}, delim='\x01', quote='', escape='', header=false)
where raw like '%Iteration(%' ''', [sys.argv[1]])
"""

INGEST = r"""
import sys
from pathlib import Path
from pipeline import store
from pipeline.ingest import ingest_paths
con = store.connect(sys.argv[2])
ingest_paths(con, [Path(sys.argv[1])], fmt="vllm-log")
"""


def write_log(path: Path, steps: int) -> None:
    """Steps with realistic variety: prefill chunks, growing batches, one line per step."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(0)
    dur = rng.lognormal(np.log(8.0), 0.4, steps)
    t = 1796014047.0 + np.cumsum(dur + 1.2) / 1000.0
    prefill = np.where(rng.random(steps) < 0.15, rng.integers(1, 2048, steps), 0)
    dec = rng.integers(1, 64, steps)
    df = pl.DataFrame(
        {
            "t": t,
            "i": np.arange(steps),
            "pr": (prefill > 0).astype(int),
            "pt": prefill,
            "dr": dec,
            "dt": dec,
            "ms": dur.round(2),
            "kv": rng.uniform(0, 90, steps).round(1),
        }
    )
    stamp = pl.from_epoch((pl.col("t") * 1e6).cast(pl.Int64), time_unit="us").dt.strftime("%m-%d %H:%M:%S")
    text = df.select(
        pl.format(
            "INFO {} [loggers.py:199] Engine 000: Iteration({}): {} context requests, {} context tokens, "
            "{} generation requests, {} generation tokens, iteration elapsed time: {} ms, GPU KV cache usage: {}%",
            stamp,
            "i",
            "pr",
            "pt",
            "dr",
            "dt",
            "ms",
            "kv",
        )
    )
    head = (ROOT / "fixtures" / "vllm" / "server.log").read_text().split("Iteration(0)")[0].rsplit("\n", 1)[0]
    with open(path, "w") as fh:
        fh.write(head + "\n")
        text.write_csv(fh, include_header=False, quote_style="never")
    import os

    os.utime(path, (t[0], t[0]))


def measure(code: str, *args: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, rss_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument(
        "--repeat", type=int, default=1, help="rounds of floor and ingest; each reports its fastest (default 1)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "server.log"
        write_log(log, args.steps)
        size = log.stat().st_size / 2**20
        out = {"steps": args.steps, "file_mib": round(size, 1)}
        out.update(floor_and_ingest(log, Path(d), FLOOR, INGEST, args.repeat))
    print(json.dumps(out, indent=1))


def floor_and_ingest(log: Path, d: Path, floor: str, ingest: str, repeat: int) -> dict:
    """Run ``floor`` and ``ingest`` (code for ``python -c``, given the file and a fresh store path)
    ``repeat`` rounds, each in a fresh process; the fastest of each, its peak RSS, and the ratio."""
    rows = {}
    # the floor first, and each in a fresh process: ru_maxrss of children is a running max,
    # so the larger one is measured last
    for _ in range(max(1, repeat)):
        for name, code, db in (("floor", floor, "floor.duckdb"), ("ingest", ingest, "store.duckdb")):
            for p in (d / db, d / (db + ".wal")):
                p.unlink(missing_ok=True)
            wall, rss = measure(code, str(log), str(d / db))
            # ru_maxrss of children is a running max: the first round's reading is the phase's own
            first = rows.get(name, (wall, rss))
            rows[name] = (min(wall, first[0]), first[1])
    out = {k: {"wall_s": round(wall, 2), "peak_rss_mib_so_far": round(rss)} for k, (wall, rss) in rows.items()}
    out["ratio_ingest_to_floor"] = round(rows["ingest"][0] / rows["floor"][0], 2)
    return out


if __name__ == "__main__":
    main()
