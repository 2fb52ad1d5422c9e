"""TensorRT-LLM IterationStats log ingest against its floor: DuckDB reading the same lines and the fields.

Writes a log of N IterationStats records (the recorded fixture's six records tiled, iter and
timestamp advancing; each line a Python dict repr, as the executor prints them) and measures,
each in its own process:

* ``floor``: ``create table t as select ... from read_csv(FILE, columns={'raw': 'VARCHAR'}, ...)``
  with the line made JSON in SQL (quotes, True/False/None) and parsed once by ``from_json`` into
  every field tracelat keeps, typed (DuckDB's parallel reader, one parse a line; no checks, no
  rejects, no stamps read in a zone);
* ``ingest``: ``tracelat ingest FILE --tz UTC`` into a fresh store (the same fields, every value
  checked, rejects with reasons, stamps on the clock, records out of order, the store).

    python benchmarks/bench_trtllm_log.py                    # 300k records (about 260 MiB)
    python benchmarks/bench_trtllm_log.py --records 50000    # quick
    python benchmarks/bench_trtllm_log.py --repeat 3         # fastest of three rounds each

Prints wall time and peak RSS of each and the ratio to the floor.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import tempfile
from pathlib import Path

from bench_vllm_log import floor_and_ingest

ROOT = Path(__file__).resolve().parents[1]

FLOOR = r"""
import duckdb, sys
con = duckdb.connect(sys.argv[2])
con.execute("set enable_progress_bar = false")  # as in tracelat
spec = {"iter": "BIGINT", "iterLatencyMS": "DOUBLE", "timestamp": "VARCHAR", "numActiveRequests": "BIGINT",
        "numQueuedRequests": "BIGINT", "numCompletedRequests": "BIGINT", "newActiveRequestsQueueLatencyMS": "DOUBLE",
        "maxBatchSizeRuntime": "BIGINT", "maxNumTokensRuntime": "BIGINT",
        "inflightBatchingStats": {"numContextRequests": "BIGINT", "numCtxTokens": "BIGINT",
                                  "numGenRequests": "BIGINT", "numPausedRequests": "BIGINT"},
        "kvCacheStats": {"usedNumBlocks": "DOUBLE", "maxNumBlocks": "DOUBLE", "tokensPerBlock": "BIGINT"}}
import json
con.execute(r'''create table t as select
  s.iter, s.iterLatencyMS as dur_ms, strptime(s.timestamp, '%m-%d-%Y %H:%M:%S.%f') as stamp,
  s.inflightBatchingStats.numContextRequests as prefill_reqs, s.inflightBatchingStats.numCtxTokens as prefill_tokens,
  s.inflightBatchingStats.numGenRequests as decode_reqs, s.inflightBatchingStats.numPausedRequests as preempted_reqs,
  s.numActiveRequests as running_reqs, s.numQueuedRequests as waiting_reqs,
  s.kvCacheStats.usedNumBlocks / s.kvCacheStats.maxNumBlocks as kv_usage, s.numCompletedRequests,
  s.newActiveRequestsQueueLatencyMS, s.maxBatchSizeRuntime, s.maxNumTokensRuntime,
  s.kvCacheStats.maxNumBlocks * s.kvCacheStats.tokensPerBlock as kv_tokens
from (select from_json(regexp_replace(regexp_replace(regexp_replace(replace(raw, chr(39), chr(34)),
        '\bTrue\b', 'true', 'g'), '\bFalse\b', 'false', 'g'), '\bNone\b', 'null', 'g'), ?) as s
      from read_csv(?, columns={'raw': 'VARCHAR'}, delim='\x01', quote='', escape='', header=false))''',
  [json.dumps(spec), sys.argv[1]])
"""

INGEST = r"""
import sys
from pathlib import Path
from pipeline import store
from pipeline.ingest import ingest_paths
con = store.connect(sys.argv[2])
ingest_paths(con, [Path(sys.argv[1])], fmt="trtllm-iterlog", tz="UTC")
"""


def write_log(path: Path, records: int) -> None:
    recs = [
        ast.literal_eval(line) for line in (ROOT / "fixtures" / "trtllm" / "iteration_log.txt").read_text().splitlines()
    ]
    t0 = dt.datetime(2026, 12, 1)
    with open(path, "w") as fh:
        for i in range(records):
            r = {**recs[i % len(recs)], "iter": i}
            r["timestamp"] = (t0 + dt.timedelta(microseconds=7000 * i)).strftime("%m-%d-%Y %H:%M:%S.%f")
            fh.write(repr(r) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of floor and ingest; each reports its fastest")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "iteration_log.txt"
        write_log(log, args.records)
        out = {"records": args.records, "file_mib": round(log.stat().st_size / 2**20, 1)}
        out.update(floor_and_ingest(log, Path(d), FLOOR, INGEST, args.repeat))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
