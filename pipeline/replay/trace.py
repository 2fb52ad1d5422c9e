"""Replay runs as canonical traces: their run id, their run record, and writing/ingesting them.

A replay trace is an ordinary canonical trace (SPEC §2) written by the
simulator's conventions (one ``run`` record, the steps, the requests with token
times), so ``tracelat ingest`` loads it like any other run. Its run id says what
it is: ``RUN~replay~<policy>-seed<k>`` where ``<policy>`` is ``recorded`` or the
changed fields (``mbt512``, ``mns16``, ``kv50000``, ``nochunk``/``chunk``), with
``-nonoise`` for a replay without noise. Its ``meta.replay`` records the source
run, the policy (and what changed), the calibrated model and noise, the seed and
the time origin. Requests keep their recorded ids; ``recorded_status`` (an extra
field) keeps their status in the recording.
"""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..sim import SimResult
from ..sim.writer import ITERATION_BATCH, REQUEST_BATCH, TRACE_ITERATION_FIELDS, run_record
from .calibrate import Calibration

SEP = "~replay~"
TAGS = {"max_num_seqs": "mns", "max_num_batched_tokens": "mbt", "kv_capacity_tokens": "kv"}


def policy_tag(cal: Calibration) -> str:
    """``recorded`` or the changed policy fields in short form (``mbt512-mns16``)."""
    parts = []
    for f, v in cal.policy_changes().items():
        parts.append(("chunk" if v else "nochunk") if f == "chunked_prefill" else f"{TAGS[f]}{v}")
    return "-".join(parts) or "recorded"


def replay_run_id(cal: Calibration, seed: int) -> str:
    """The run id of one replay of ``cal.run_id``."""
    noise = "-nonoise" if cal.details.get("noise_mode") == "none" else ""
    return f"{cal.run_id}{SEP}{policy_tag(cal)}{noise}-seed{seed}"


def replay_meta(cal: Calibration, seed: int, result: SimResult) -> dict[str, Any]:
    """``meta.replay`` of a replay run."""
    return {
        "replay_of": cal.run_id,
        "policy": cal.policy.to_dict(),
        "recorded_policy": dict(cal.baseline_policy),
        "changed": cal.policy_changes(),
        "model": cal.model.to_dict(),
        "noise": cal.noise.to_dict(),
        "noise_mode": cal.details.get("noise_mode"),
        "seed": seed,
        "t_origin_s": cal.t_origin_s,
        "calibration": {k: v for k, v in cal.details.items() if k != "noise_mode"},
        "stop": result.info.get("stop"),
        "notes": list(cal.notes),
    }


def _source_run(con, run_id: str) -> dict[str, Any]:
    rows = con.execute("select model, gpu from runs where run_id = ?", [run_id]).fetchall() if con else []
    return {"model": rows[0][0], "gpu": rows[0][1]} if rows else {}


def write_replay(result: SimResult, path, run_id: str, cal: Calibration, seed: int, con=None,
                 with_token_times: bool = True) -> Path:
    """Write one replay as canonical JSON Lines (gzip when the name ends in ``.gz``)."""
    import polars as pl

    src = _source_run(con, cal.run_id)
    rec = run_record(run_id, cal.policy, cal.model, cal.noise, cal.workload.describe(),
                     model_name=src.get("model") or "replayed", gpu=src.get("gpu") or "simulated")
    rec["meta"]["replay"] = replay_meta(cal, seed, result)
    path = Path(path)
    with _open_out(path) as fh:
        fh.write((json.dumps(_plain(rec), allow_nan=False, separators=(",", ":")) + "\n").encode())
        it = result.iterations
        for lo in range(0, result.n_iterations, ITERATION_BATCH):
            sl = slice(lo, lo + ITERATION_BATCH)
            pl.DataFrame({"kind": "iteration", **{f: it[f][sl] for f in TRACE_ITERATION_FIELDS}}).write_ndjson(fh)
        offsets, values = result.token_times_flat() if with_token_times else (None, None)
        for lo in range(0, result.n_requests, REQUEST_BATCH):
            _requests(result, cal, lo, min(lo + REQUEST_BATCH, result.n_requests), offsets, values).write_ndjson(fh)
    return path


@contextmanager
def _open_out(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open(path, "wb", compresslevel=3) if path.name.endswith(".gz") else open(path, "wb")
    with opener as fh:
        yield fh


def _plain(obj: Any) -> Any:
    """Numpy scalars to Python values, non-finite floats to None (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def _requests(result: SimResult, cal: Calibration, lo: int, hi: int, offsets, values):
    import polars as pl

    rq = result.requests
    times = ["t_arrival", "t_scheduled", "t_first_token", "t_finish"]
    df = pl.DataFrame({
        "kind": "request",
        "req_id": np.asarray(rq["req_id"][lo:hi]).astype(str),
        **{c: rq[c][lo:hi] for c in times},
        "prompt_tokens": rq["prompt_tokens"][lo:hi],
        "output_tokens": rq["output_tokens"][lo:hi],
        "preemptions": rq["preemptions"][lo:hi],
        "status": np.asarray(rq["status"][lo:hi]).astype(str),
        "recorded_status": np.asarray(cal.recorded_status[lo:hi]).astype(str),
    }).with_columns(pl.col(times).fill_nan(None))
    if offsets is not None:
        import pyarrow as pa

        off = offsets[lo:hi + 1]
        lists = pa.LargeListArray.from_arrays(pa.array(off - off[0], pa.int64()), pa.array(values[off[0]:off[-1]]))
        df = df.with_columns(pl.Series("token_times", pl.from_arrow(lists)))
    return df


def drop_replay(con, run_id: str) -> int:
    """Delete the stored rows of an earlier replay with this run id; the number of ingests removed.

    Only ingests that hold nothing but replay runs are touched, so a recorded run is
    never deleted. A replay is derived data: ``tracelat replay`` recreates it.
    """
    from .. import store

    if SEP not in run_id:
        raise ValueError(f"{run_id!r} is not a replay run id")
    which = ("select ingest_id from ingests where list_contains(run_ids, $rid) "
             "and len(list_filter(run_ids, lambda r: not contains(r, $sep))) = 0")
    ids = [r[0] for r in con.execute(which, {"rid": run_id, "sep": SEP}).fetchall()]
    if not ids:
        return 0
    con.execute("begin transaction")
    try:
        for table in (t for t in store.BASE_TABLES if t != "ingests"):
            con.execute(f'delete from "{table}" where ingest_id = any($ids)', {"ids": ids})
        con.execute("delete from ingests where ingest_id = any($ids)", {"ids": ids})
        con.execute("commit")
    except BaseException:
        con.execute("rollback")
        raise
    return len(ids)


def ingest_replay(con, path: Path, run_id: str) -> list[str]:
    """Ingest a written replay into the store, replacing an earlier replay of the same id; its run ids."""
    from .. import ingest, store

    drop_replay(con, run_id)
    results = ingest.ingest_paths(con, [path], fmt="jsonl", replace=True)
    store.build_derived(con)
    return sorted({r for res in results for r in res.run_ids})
