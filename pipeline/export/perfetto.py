"""A run as a Chrome/Perfetto trace (Trace Event Format JSON), for ui.perfetto.dev or chrome://tracing.

Tracks:

* process 1 "engine": one complete slice (``ph: X``) per step on thread 1, with its
  batch (prefill/decode tokens and requests, context tokens) and, when the run has a
  fit, the model's prediction, residual and spike cause; stalls as instant events
  (``ph: i``); counters (``ph: C``) for KV usage, running and waiting requests.
* process 2 "requests": one async slice per request (``ph: b``/``e``, id = request)
  with nested ``queue``, ``prefill`` and ``decode`` phases; args carry sizes and
  preemptions.

Times are microseconds since the run's first event (``metadata.origin_unix_s`` says
where that is).  Size bound: a run of more than ``max_steps`` steps keeps every step
that is a spike or a stall and an even sample of the rest (every k-th step), and says
so in ``metadata.step_sampling``; requests are kept whole, the counters follow the kept
steps.  A step that begins before the one before it ends (a log's stamps and timings may
overlap) is drawn from that end, its measured time in ``args.iteration_ms``; steps without
times are counted in the metadata.  Events are built as columns and encoded by Polars: no
Python loop over steps or requests.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import polars as pl

from .. import store
from ..errors import InputError

MAX_STEPS = 200_000


def _us(col: str, origin: float) -> pl.Expr:
    return ((pl.col(col) - origin) * 1e6).round(3)


def _meta_events() -> list[dict]:
    names = [(1, "process_name", {"name": "engine"}), (2, "process_name", {"name": "requests"})]
    ev = [{"ph": "M", "pid": pid, "tid": 0, "name": n, "args": a} for pid, n, a in names]
    ev.append({"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "steps"}})
    return ev


def export(con: duckdb.DuckDBPyConnection, run_id: str, out: Path, max_steps: int = MAX_STEPS) -> dict:
    """Write the trace; returns what was written (event counts, sampling rule)."""
    from ..ingest.align import cross_clock_problem

    problem = cross_clock_problem(con, run_id)
    if problem:  # steps and requests would lie decades apart on one timeline
        raise InputError(
            f"{problem}; a timeline needs steps and requests on one clock: pass "
            "--clock-offset SOURCE=SECONDS at ingest, or check that the files belong to one run"
        )
    steps = store.select(con, "export/perfetto_steps", {"run": run_id})
    # steps with no place in time (a duration only) cannot be drawn: counted, not dropped unsaid
    untimed = (
        int(store.scalar(con, "select count(*) from iteration_metrics where run_id = $r", {"r": run_id})) - steps.height
    )
    reqs = store.select(con, "export/perfetto_requests", {"run": run_id})
    has_fit = store.table_exists(con, "iteration_fit")
    if has_fit and steps.height:
        steps = steps.join(store.select(con, "export/perfetto_fit", {"run": run_id}), on="iter", how="left")
    else:
        steps = steps.with_columns(
            predicted_ms=pl.lit(None, pl.Float64),
            residual_ms=pl.lit(None, pl.Float64),
            spike_cause=pl.lit(None, pl.String),
            is_stall=pl.lit(None, pl.Boolean),
        )
    starts = [
        x
        for x in (
            steps.get_column("t_start").min() if steps.height else None,
            reqs.get_column("t_arrival").min() if reqs.height else None,
        )
        if x is not None
    ]
    if not starts:
        raise ValueError(f"run {run_id} has no timed steps or requests to export")
    origin = float(min(starts))
    sampling = "all steps"
    if steps.height > max_steps:
        k = -(-steps.height // max_steps)
        keep = (
            pl.col("spike_cause").is_not_null()
            | pl.col("is_stall").fill_null(False)
            | (pl.int_range(pl.len()) % k == 0)
        )
        steps = steps.filter(keep)
        sampling = f"{max_steps:,}+ steps: every spike and stall, and every {k}th other step"
    # Slices of one thread must not overlap (Perfetto drops a slice that starts inside the one
    # before it), but a log's steps may: vLLM stamps the line after the step and times another
    # interval than the stamps span. Such a step's slice starts where the one before it ends; its
    # measured time stays in args.iteration_ms, the cut in args.overlap_ms.
    steps = steps.with_columns(
        shown=pl.max_horizontal("t_start", pl.col("t_end").shift(1)),
        overlap_ms=pl.when(pl.col("t_end").shift(1) > pl.col("t_start")).then(
            ((pl.col("t_end").shift(1) - pl.col("t_start")) * 1000).round(6)
        ),
    )
    step_ev = steps.select(
        ph=pl.lit("X"),
        pid=pl.lit(1),
        tid=pl.lit(1),
        name=pl.lit("step"),
        ts=_us("shown", origin),
        # the registry's step time, less what the step before it covers
        dur=pl.min_horizontal(pl.col("iteration_ms") * 1e3, (pl.col("t_end") - pl.col("shown")) * 1e6).round(3).clip(0),
        args=pl.struct(
            "iter",
            "iteration_ms",
            "overlap_ms",
            "prefill_tokens",
            "prefill_reqs",
            "decode_tokens",
            "decode_reqs",
            "context_tokens",
            "predicted_ms",
            "residual_ms",
            "spike_cause",
        ),
    )
    stall_ev = steps.filter(pl.col("is_stall").fill_null(False)).select(
        ph=pl.lit("i"),
        s=pl.lit("t"),
        pid=pl.lit(1),
        tid=pl.lit(1),
        name=pl.lit("stall"),
        ts=_us("t_end", origin),
        args=pl.struct("iter", "residual_ms"),
    )
    # the counters follow the kept steps: the file's size is bound by --max-steps, not by the run
    counters = [
        steps.filter(pl.col(c).is_not_null()).select(
            ph=pl.lit("C"), pid=pl.lit(1), name=pl.lit(c), ts=_us("t_end", origin), args=pl.struct(pl.col(c))
        )
        for c in ("kv_usage", "running_reqs", "waiting_reqs")
        if c in steps.columns
    ]
    rq = reqs.with_row_index("n").with_columns(id=pl.col("n").cast(pl.String))
    common = dict(pid=pl.lit(2), tid=pl.lit(0), cat=pl.lit("request"), id=pl.col("id"))
    rq = rq.with_columns(t_last=pl.coalesce("t_finish", "t_first_token", "t_scheduled", "t_arrival"))
    begin = rq.select(
        ph=pl.lit("b"),
        name=pl.lit("request ") + pl.col("req_id"),
        ts=_us("t_arrival", origin),
        **common,
        args=pl.struct("req_id", "prompt_tokens", "output_tokens", "preemptions", "status"),
    )
    end = rq.select(ph=pl.lit("e"), name=pl.lit("request ") + pl.col("req_id"), ts=_us("t_last", origin), **common)
    phases = []
    for name, a, b in (
        ("queue", "t_arrival", "t_scheduled"),
        ("prefill", "t_scheduled", "t_first_token"),
        ("decode", "t_first_token", "t_finish"),
    ):
        part = rq.filter(pl.col(a).is_not_null() & pl.col(b).is_not_null() & (pl.col(b) >= pl.col(a)))
        phases += [
            part.select(ph=pl.lit("b"), name=pl.lit(name), ts=_us(a, origin), **common),
            part.select(ph=pl.lit("e"), name=pl.lit(name), ts=_us(b, origin), **common),
        ]
    frames = [step_ev, stall_ev, *counters, begin, *phases, end]
    lines = pl.concat([f.select(pl.struct(pl.all()).struct.json_encode().alias("e")) for f in frames if f.height])
    meta = {
        "run_id": run_id,
        "origin_unix_s": origin,
        "step_sampling": sampling,
        "time_unit": "us since origin",
        "steps": int(step_ev.height),
        "steps_overlapping_the_one_before": int(steps.get_column("overlap_ms").is_not_null().sum()),
        "steps_without_times": untimed,
        "requests": int(reqs.height),
        "stalls": int(stall_ev.height),
        "source": "tracelat export --perfetto",
    }
    head = json.dumps({"displayTimeUnit": "ms", "metadata": meta})[:-1] + ', "traceEvents": [\n'
    n = lines.height
    lines = lines.with_columns(e=pl.when(pl.int_range(pl.len()) < n - 1).then(pl.col("e") + ",").otherwise(pl.col("e")))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if out.name.endswith(".gz") else open
    with opener(out, "wt", encoding="utf-8") as fh:
        fh.write(head + "".join(json.dumps(e) + ",\n" for e in _meta_events()))
        # rendered first: Polars given a file object may write to its descriptor, past gzip
        fh.write(lines.write_csv(include_header=False, quote_style="never"))
        fh.write("]}\n")
    return meta | {"events": n + len(_meta_events()), "path": str(out), "bytes": out.stat().st_size}
