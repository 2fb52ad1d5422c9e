"""Split a simulated run into the two files a real incident comes as: server steps and client requests.

The server file holds the run record and the steps (no request ids), on a ``unix``
clock; the client file holds only what a load generator sees (arrival, first
token, finish, token times, sizes: no ``t_scheduled``, no preemption counts) on a
``monotonic`` clock with another origin.  ``server_origin_s - client_origin_s`` is
the true offset that clock alignment must find (``pipeline/ingest/clocks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.jsonplain import plain
from pipeline.sim.engine import Policy, SimResult
from pipeline.sim.model import IterationModel, NoiseModel
from pipeline.sim.writer import TRACE_ITERATION_FIELDS, _open_out, run_record

CLIENT_FIELDS = ("req_id", "t_arrival", "t_first_token", "t_finish", "prompt_tokens", "output_tokens", "status")


def write_split(result: SimResult, server_path, client_path, run_id: str, policy: Policy, model: IterationModel,
                noise: NoiseModel, server_origin_s: float = 1.79e9, client_origin_s: float = 5000.0,
                model_name: str = "simulated", gpu: str = "simulated") -> float:
    """Write both files; returns the true offset (server clock minus client clock, seconds)."""
    import polars as pl

    rec = run_record(run_id, policy, model, noise, None, model_name, gpu)
    rec.update(clock="unix")
    rec["meta"] = plain(rec["meta"])
    with _open_out(Path(server_path)) as fh:
        fh.write((json.dumps(rec, separators=(",", ":")) + "\n").encode())
        it = result.iterations
        cols = {"kind": "iteration", **{f: it[f] for f in TRACE_ITERATION_FIELDS}}
        pl.DataFrame(cols).with_columns(pl.col("t_start", "t_end") + server_origin_s).write_ndjson(fh)
    rq = result.requests
    offsets, values = result.token_times_flat()
    import pyarrow as pa

    lists = pa.LargeListArray.from_arrays(pa.array(offsets - offsets[0], pa.int64()), pa.array(values + client_origin_s))
    times = ["t_arrival", "t_first_token", "t_finish"]
    df = pl.DataFrame({
        "kind": "request",
        "req_id": np.asarray(rq["req_id"]).astype(str),
        **{c: rq[c] + client_origin_s for c in times},
        "prompt_tokens": rq["prompt_tokens"],
        "output_tokens": rq["output_tokens"],
        "status": np.asarray(rq["status"]).astype(str),
    }).with_columns(pl.col(times).fill_nan(None), pl.Series("token_times", pl.from_arrow(lists)))
    client = {"kind": "run", "run_id": run_id, "clock": "monotonic", "meta": {"source": "simulated client"}}
    with _open_out(Path(client_path)) as fh:
        fh.write((json.dumps(client) + "\n").encode())
        df.write_ndjson(fh)
    return server_origin_s - client_origin_s
