"""Write a :class:`SimResult` as a canonical trace (docs/canonical-format.md) and a ground-truth file.

The trace is JSON Lines: one ``run`` record, then one ``iteration`` record per
step, then one ``request`` record per request. Rows are serialised by Polars
(``write_ndjson``), never one ``json.dumps`` per row. Floats keep full
precision (shortest round-trip form), so reading the file back gives the
simulator's exact values. A path ending in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pipeline import __version__
from pipeline.jsonplain import plain
from pipeline.sim.engine import TRACE_ITERATION_FIELDS, Policy, SimResult
from pipeline.sim.model import IterationModel, NoiseModel

ENGINE = "tracelat-sim"
REQUEST_BATCH = 50_000  # requests per write_ndjson call: bounds memory when token lists are long
ITERATION_BATCH = 1_000_000


@contextmanager
def _open_out(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb", compresslevel=3) as fh:
            yield fh
    else:
        with open(path, "wb") as fh:
            yield fh


def run_record(
    run_id: str,
    policy: Policy,
    model: IterationModel,
    noise: NoiseModel,
    workload_info: dict | None = None,
    model_name: str = "simulated",
    gpu: str = "simulated",
) -> dict:
    """The ``run`` record of a simulated trace."""
    meta = {**policy.to_dict(), "simulated": True, "iteration_model": model.to_dict(), "noise": noise.to_dict()}
    if workload_info:
        meta["workload"] = workload_info
    return {
        "kind": "run",
        "run_id": run_id,
        "engine": ENGINE,
        "engine_version": __version__,
        "model": model_name,
        "gpu": gpu,
        "clock": "monotonic",
        "meta": meta,
    }


def write_trace(
    result: SimResult,
    path,
    run_id: str,
    policy: Policy,
    model: IterationModel,
    noise: NoiseModel,
    workload_info: dict | None = None,
    with_token_times: bool = True,
    model_name: str = "simulated",
    gpu: str = "simulated",
    meta_extra: dict | None = None,
    request_columns: dict[str, np.ndarray] | None = None,
    run_fields: dict | None = None,
) -> Path:
    """Write ``result`` as canonical JSON Lines at ``path`` (gzip if it ends in ``.gz``).

    Request times not reached (a run stopped early) are written as ``null``;
    such requests have status ``aborted``. ``with_token_times=False`` leaves out
    the per-token ``token_times`` lists (much smaller files for huge runs).
    ``meta_extra`` is merged into the run record's ``meta``; ``request_columns``
    adds fields to the request records (arrays aligned with ``result.requests``);
    ``run_fields`` adds fields of the run record (``dtype``, ``kv_dtype``; None values are left out).
    """
    import polars as pl

    path = Path(path)
    if policy.prefix_caching and "cached_tokens" in result.requests:
        # the prefix-cache hits, as vLLM's num_cached_tokens: a replay of this trace can reuse them
        request_columns = {**(request_columns or {}), "cached_tokens": result.requests["cached_tokens"]}
    rec = run_record(
        run_id,
        policy=policy,
        model=model,
        noise=noise,
        workload_info=plain(workload_info),
        model_name=model_name,
        gpu=gpu,
    )
    rec["meta"].update(plain(meta_extra or {}))
    rec.update({k: v for k, v in (run_fields or {}).items() if v is not None})
    with _open_out(path) as fh:
        fh.write((json.dumps(rec, allow_nan=False, separators=(",", ":")) + "\n").encode())
        it = result.iterations
        for lo in range(0, result.n_iterations, ITERATION_BATCH):
            sl = slice(lo, lo + ITERATION_BATCH)
            cols = {"kind": "iteration", **{f: it[f][sl] for f in TRACE_ITERATION_FIELDS}}
            if model.e_ms_per_prefill_attn and "prefill_attn" in it:
                # the exact feature of the prefill-attention cost (an extra field, kept in the store's
                # `extra`): an engine log has no per-chunk context, so a fit otherwise approximates it
                cols["prefill_attn"] = it["prefill_attn"][sl]
            pl.DataFrame(cols).write_ndjson(fh)
        offsets, values = result.token_times_flat() if with_token_times else (None, None)
        for lo in range(0, result.n_requests, REQUEST_BATCH):
            hi = min(lo + REQUEST_BATCH, result.n_requests)
            _request_frame(result, lo, hi, offsets, values, request_columns).write_ndjson(fh)
    return path


def _request_frame(result: SimResult, lo: int, hi: int, offsets, values, extra: dict | None = None):
    import polars as pl

    rq = result.requests
    times = ["t_arrival", "t_scheduled", "t_first_token", "t_finish"]
    df = pl.DataFrame(
        {
            "kind": "request",
            "req_id": np.asarray(rq["req_id"][lo:hi]).astype(str),
            **{c: rq[c][lo:hi] for c in times},
            "prompt_tokens": rq["prompt_tokens"][lo:hi],
            "output_tokens": rq["output_tokens"][lo:hi],
            "preemptions": rq["preemptions"][lo:hi],
            "status": np.asarray(rq["status"][lo:hi]).astype(str),
            **{name: np.asarray(col[lo:hi]) for name, col in (extra or {}).items()},
        }
    ).with_columns(pl.col(times).fill_nan(None))
    if offsets is not None:
        import pyarrow as pa

        off = offsets[lo : hi + 1]
        lists = pa.LargeListArray.from_arrays(pa.array(off - off[0], pa.int64()), pa.array(values[off[0] : off[-1]]))
        df = df.with_columns(pl.Series("token_times", pl.from_arrow(lists)))
    return df


def stalls(result: SimResult) -> list[dict]:
    """The injected stalls: one ``{iter, t_start, t_end, stall_ms}`` per stalled iteration."""
    it = result.iterations
    idx = np.flatnonzero(it["stall_ms"] > 0)
    return [
        {"iter": int(i), "t_start": float(s), "t_end": float(e), "stall_ms": float(ms)}
        for i, s, e, ms in zip(idx, it["t_start"][idx], it["t_end"][idx], it["stall_ms"][idx])
    ]


def write_truth(
    path,
    result: SimResult,
    run_id: str,
    policy: Policy,
    model: IterationModel,
    noise: NoiseModel,
    seed: int,
    workload_info: dict | None = None,
    trace_path=None,
) -> Path:
    """Write the ground truth of a simulated run as one JSON document.

    Holds every parameter (workload, policy, iteration model, noise, seed), run
    counts, and the injected stalls, so analyses of the trace can be checked
    against what was put in.
    """
    path = Path(path)
    doc = {
        "run_id": run_id,
        "engine": ENGINE,
        "engine_version": __version__,
        "trace": Path(trace_path).name if trace_path is not None else None,
        "seed": seed,
        "workload": plain(workload_info or {}),
        "policy": policy.to_dict(),
        "model": model.to_dict(),
        "noise": noise.to_dict(),
        "result": {
            "iterations": result.n_iterations,
            "requests": result.n_requests,
            "requests_ok": int(np.sum(result.requests["status"] == "ok")),
            "duration_s": float(result.iterations["t_end"][-1]) if result.n_iterations else 0.0,
            "preemptions": int(result.requests["preemptions"].sum()),
            "stop": result.info.get("stop"),
        },
        "stalls": stalls(result),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
