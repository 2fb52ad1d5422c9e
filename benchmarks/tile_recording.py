"""A big canonical trace made of a real recording: the vLLM CPU run of fixtures/vllm, tiled.

    python benchmarks/tile_recording.py OUT.jsonl [--iterations 1000000] [--run-id bench]

The recorded run (fixtures/vllm/NOTE.md: vLLM 0.32.0 server log with iteration details and
the `vllm bench serve` JSON of the same run, 532 steps, 64 requests, 2069 token times) is
ingested as a user would (the two files joined on one clock), then written out as canonical
JSON Lines, repeated back to back until it has at least ``--iterations`` steps: copy ``k``
is shifted by ``k`` times the run's span, its step numbers by ``k`` times its step count, and
its request ids get the prefix ``k-``.  Every step, request and gap of a copy is a real one, so
the field shapes (time stamps, counts, token lists of a real engine) are those of a recording,
not of tracelat's simulator; only the length is made.  ``bench_ingest.py --trace`` measures it.

Only canonical fields are written (a converter's extras are not), and columns the recording
lacks (waiting_reqs, running_reqs, cached_tokens, req_ids) are left out, not written as null.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import store  # noqa: E402
from pipeline.ingest import ingest_paths  # noqa: E402
from pipeline.ingest.canonical_sql import ITERATION_FIELDS, REQUEST_FIELDS  # noqa: E402

RECORDING = [REPO / "fixtures" / "vllm" / "server_epoch.log", REPO / "fixtures" / "vllm" / "bench.json"]
# the run's scheduling policy; the rest of its meta describes the recorded files (clock alignment,
# the bench's own summary), which the tiled trace is not
_POLICY = ("max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "kv_capacity_tokens", "kv_block_size")
_TIMES = {"t_start", "t_end", "t_arrival", "t_scheduled", "t_first_token", "t_finish"}


def _present(con, table: str, names: list[str]) -> list[str]:
    """The columns of ``names`` that hold a value in some row of ``table``."""
    counts = con.execute(f"select {', '.join(f'count({n})' for n in names)} from {table}").fetchone()
    return [n for n, c in zip(names, counts) if c]


def tile(out: Path, iterations: int, run_id: str = "bench") -> dict:
    con = store.connect(":memory:")
    for _ in ingest_paths(con, RECORDING, run_id="rec"):
        pass
    n_steps, n_requests, n_tokens, t0, t1 = con.execute(
        "select count(*), (select count(*) from requests), (select sum(len(t_s)) from token_lists), "
        "least(min(t_start), (select min(t_arrival) from requests)), "
        "greatest(max(t_end), (select max(t_finish) from requests)) from iterations"
    ).fetchone()
    copies = math.ceil(iterations / n_steps)
    period = (t1 - t0) + 0.01  # copies back to back, 10 ms apart
    con.execute("create temp table k as select range as k from range(?)", [copies])

    def shifted(name: str, src: str) -> str:
        return f"{src}.{name} + k.k * {period!r} as {name}" if name in _TIMES else f"{src}.{name}"

    it_cols = _present(con, "iterations", [f.name for f in ITERATION_FIELDS])
    rq_cols = _present(con, "requests", [f.name for f in REQUEST_FIELDS if f.name != "token_times"])
    it_sql = (
        f"select 'iteration' as kind, ? as run_id, i.iter + k.k * {n_steps} as iter, "
        + ", ".join(shifted(c, "i") for c in it_cols if c != "iter")
        + " from iterations i, k order by k.k, i.iter"
    )
    rq_sql = (
        "select 'request' as kind, ? as run_id, k.k || '-' || r.req_id as req_id, "
        + ", ".join(shifted(c, "r") for c in rq_cols if c != "req_id")
        + f", list_transform(tl.t_s, lambda t: t + k.k * {period!r}) as token_times"
        " from requests r join token_lists tl using (run_id, req_id), k order by k.k, r.t_arrival"
    )
    with tempfile.TemporaryDirectory() as tmp:
        parts = []
        for i, sql in enumerate((it_sql, rq_sql)):
            part = Path(tmp) / f"{i}.jsonl"
            # COPY takes its target as text: the path is ours (a temporary folder)
            target = store.quote_literal(str(part))
            con.execute(f"copy ({sql}) to {target} (format json)", [run_id])
            parts.append(part)
        run = con.execute(
            "select to_json({kind: 'run', run_id: ?, engine: engine, engine_version: engine_version, "
            "model: model, clock: clock, meta: json_object("
            + ", ".join(f"'{k}', meta->'$.{k}'" for k in _POLICY)
            + ")}) from runs where run_id = 'rec'",
            [run_id],
        ).fetchone()[0]
        with open(out, "wb") as f:
            f.write(run.encode() + b"\n")
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, f, 16 << 20)
    return {
        "copies": copies,
        "iterations": n_steps * copies,
        "requests": n_requests * copies,
        "token_times": int(n_tokens) * copies,
        "mib": round(out.stat().st_size / 2**20, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--iterations", type=int, default=1_000_000, help="at least this many steps (default 1000000)")
    ap.add_argument("--run-id", default="bench")
    args = ap.parse_args()
    print(tile(args.out, args.iterations, args.run_id))


if __name__ == "__main__":
    main()
