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

SCENARIOS = ("light", "incident", "kv")


def scenario(kind: str, seed: int):
    """A simulated run to split, with what it was made of: ``(result, policy, model, noise)``.

    ``light``: 4 req/s; ``incident``: 8 req/s with a burst of 12 prompts of 16k tokens at
    30 s (head-of-line blocking); ``kv``: KV cache far too small (preemptions).
    """
    from pipeline.sim.engine import simulate
    from pipeline.sim.workload import add_burst, poisson_workload

    model = IterationModel(t0_ms=6.8, a_ms_per_ctx=0.00025, b_ms_per_prefill=0.032, c_ms_per_decode=0.0)
    noise = NoiseModel(sigma=0.03, stall_rate=0.005, stall_ms_mean=50.0)
    if kind == "light":
        w = poisson_workload(300, 4, 300, 0.6, 120, 0.6, seed=seed)
        pol = Policy(max_num_seqs=64, max_num_batched_tokens=2048)
    elif kind == "incident":
        w = add_burst(poisson_workload(500, 8, 400, 0.6, 120, 0.6, seed=seed), 30.0, 12, 16000, 16, spread_s=1.0)
        pol = Policy(max_num_seqs=128, max_num_batched_tokens=2048)
    elif kind == "kv":
        w = poisson_workload(400, 20, 400, 0.6, 300, 0.6, seed=seed)
        pol = Policy(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=30000)
    else:
        raise ValueError(f"unknown scenario {kind!r}; one of {', '.join(SCENARIOS)}")
    return simulate(w, policy=pol, model=model, noise=noise, seed=seed), pol, model, noise


CLIENT_FIELDS = ("req_id", "t_arrival", "t_first_token", "t_finish", "prompt_tokens", "output_tokens", "status")


def write_split(
    result: SimResult,
    server_path,
    client_path,
    run_id: str,
    policy: Policy,
    model: IterationModel,
    noise: NoiseModel,
    server_origin_s: float = 1.79e9,
    client_origin_s: float = 5000.0,
    model_name: str = "simulated",
    gpu: str = "simulated",
) -> float:
    """Write both files; returns the true offset (server clock minus client clock, seconds)."""
    import polars as pl

    rec = run_record(run_id, policy=policy, model=model, noise=noise, model_name=model_name, gpu=gpu)
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

    lists = pa.LargeListArray.from_arrays(
        pa.array(offsets - offsets[0], pa.int64()), pa.array(values + client_origin_s)
    )
    times = ["t_arrival", "t_first_token", "t_finish"]
    df = pl.DataFrame(
        {
            "kind": "request",
            "req_id": np.asarray(rq["req_id"]).astype(str),
            **{c: rq[c] + client_origin_s for c in times},
            "prompt_tokens": rq["prompt_tokens"],
            "output_tokens": rq["output_tokens"],
            "status": np.asarray(rq["status"]).astype(str),
        }
    ).with_columns(pl.col(times).fill_nan(None), pl.Series("token_times", pl.from_arrow(lists)))
    client = {"kind": "run", "run_id": run_id, "clock": "monotonic", "meta": {"source": "simulated client"}}
    with _open_out(Path(client_path)) as fh:
        fh.write((json.dumps(client) + "\n").encode())
        df.write_ndjson(fh)
    return server_origin_s - client_origin_s


def write_engine_pair(
    result: SimResult, log_path, aiperf_path, server_origin_s: float = 1.79e9, client_clock_error_s: float = 3.7
) -> float:
    """The same split in engine formats: a vLLM server log in vLLM's default format (1-second
    local stamps in UTC, ``--enable-logging-iteration-details``) and an AIPerf
    ``profile_export.jsonl`` from a client whose unix clock is ``client_clock_error_s`` behind.
    Returns the true offset (server clock minus client clock).  The log file's modification
    time is set to the run's start, where vLLM's year-less stamps take their year from."""
    import os

    import polars as pl
    import pyarrow as pa

    it = result.iterations
    end = pl.Series(it["t_end"] + server_origin_s)
    stamp = pl.from_epoch((end * 1e6).cast(pl.Int64), time_unit="us").dt.strftime("%m-%d %H:%M:%S")
    kv = np.nan_to_num(np.asarray(it["kv_usage"], dtype=float)) * 100
    lines = pl.DataFrame(
        {
            "s": stamp,
            "i": np.arange(len(end)),
            "pr": it["prefill_reqs"],
            "pt": it["prefill_tokens"],
            "dr": it["decode_reqs"],
            "dt": it["decode_tokens"],
            "ms": (it["t_end"] - it["t_start"]) * 1e3,
            "kv": kv,
        }
    )
    text = lines.select(
        pl.format(
            "INFO {} [loggers.py:199] Engine 000: Iteration({}): {} context requests, {} context tokens, "
            "{} generation requests, {} generation tokens, iteration elapsed time: {} ms, GPU KV cache usage: {}%",
            "s",
            "i",
            "pr",
            "pt",
            "dr",
            "dt",
            pl.col("ms").round(2),
            pl.col("kv").round(1),
        )
    )
    with open(log_path, "w") as fh:
        fh.write("INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
        text.write_csv(fh, include_header=False, quote_style="never")
    start = server_origin_s + float(np.nanmin(it["t_start"]))
    os.utime(log_path, (start, start))
    rq = result.requests
    offsets, values = result.token_times_flat()
    origin = server_origin_s - client_clock_error_s
    lists = pa.LargeListArray.from_arrays(pa.array(offsets - offsets[0], pa.int64()), pa.array(values * 1e3))

    def ms(name: str) -> pl.Expr:
        return pl.struct(value=pl.col(name), unit=pl.lit("ms"))

    def toks(name: str) -> pl.Expr:
        return pl.struct(value=pl.col(name), unit=pl.lit("tokens"))

    base = (
        pl.DataFrame(
            {
                "req_id": np.asarray(rq["req_id"]).astype(str),
                "status": np.asarray(rq["status"]).astype(str),
                "t_arrival": rq["t_arrival"],
                "t_first_token": rq["t_first_token"],
                "t_finish": rq["t_finish"],
                "prompt_tokens": rq["prompt_tokens"],
                "output_tokens": rq["output_tokens"],
            }
        )
        .with_columns(tok_ms=pl.from_arrow(lists))
        .filter(pl.col("status") == "ok")
    )
    df = base.with_columns(
        ttft=(pl.col("t_first_token") - pl.col("t_arrival")) * 1e3,
        lat=(pl.col("t_finish") - pl.col("t_arrival")) * 1e3,
        icl=pl.col("tok_ms").list.diff().list.slice(1),
    ).select(
        metadata=pl.struct(
            x_request_id=pl.col("req_id"),
            request_start_ns=((pl.col("t_arrival") + origin) * 1e9).round().cast(pl.Int64),
            request_end_ns=((pl.col("t_finish") + origin) * 1e9).round().cast(pl.Int64),
            benchmark_phase=pl.lit("profiling"),
        ),
        metrics=pl.struct(
            time_to_first_token=ms("ttft"),
            request_latency=ms("lat"),
            inter_chunk_latency=ms("icl"),
            input_sequence_length=toks("prompt_tokens"),
            output_sequence_length=toks("output_tokens"),
        ),
    )
    df.write_ndjson(aiperf_path)
    return client_clock_error_s


def write_sglang_log(result: SimResult, log_path, server_origin_s: float = 1.79e9, decode_interval: int = 40) -> None:
    """The server side of the split as an SGLang scheduler log: a ``Prefill batch`` line for every
    step with prefill, a ``Decode batch`` line for every ``decode_interval``-th step with decode
    (SGLang's ``decode_log_interval``), stamped to the second in UTC as SGLang stamps them.  Pairs
    with :func:`write_engine_pair`'s AIPerf export (same ``server_origin_s``)."""
    import polars as pl

    it = result.iterations
    end = pl.Series(it["t_end"] + server_origin_s)
    df = pl.DataFrame(
        {
            "s": pl.from_epoch((end * 1e6).cast(pl.Int64), time_unit="us").dt.strftime("%Y-%m-%d %H:%M:%S"),
            "pr": it["prefill_reqs"],
            "pt": it["prefill_tokens"],
            "dr": it["decode_reqs"],
            "dt": it["decode_tokens"],
            "ctx": it["context_tokens"],
            "run": it["running_reqs"],
            "wait": it["waiting_reqs"],
            "sec": it["t_end"] - it["t_start"],
        }
    ).with_row_index("i")
    prefill = df.filter(pl.col("pr") > 0).select(
        "i",
        k=pl.lit(0),
        line=pl.format(
            "[{}] Prefill batch. #new-seq: {}, #new-token: {}, #cached-token: 0, token usage: 0.01, "
            "#running-req: {}, #queue-req: {}, ",
            "s",
            "pr",
            "pt",
            "run",
            "wait",
        ),
    )
    decode = (
        df.filter(pl.col("dr") > 0)
        .filter(pl.int_range(pl.len()) % decode_interval == decode_interval - 1)
        .select(
            "i",
            k=pl.lit(1),
            line=pl.format(
                "[{}] Decode batch. #running-req: {}, #token: {}, token usage: 0.01, cuda graph: True, "
                "gen throughput (token/s): {}, #queue-req: {}, ",
                "s",
                "dr",
                "ctx",
                (pl.col("dt") / pl.col("sec")).round(2),
                "wait",
            ),
        )
    )
    lines = pl.concat([prefill, decode]).sort("i", "k").get_column("line")
    first = pl.from_epoch(pl.Series([int((server_origin_s + float(np.nanmin(it["t_start"]))) * 1e6)]), time_unit="us")
    with open(log_path, "w") as fh:
        fh.write(f"[{first.dt.strftime('%Y-%m-%d %H:%M:%S')[0]}] INFO:     Started server process [1]\n")
        fh.write("\n".join(lines.to_list()) + "\n")
