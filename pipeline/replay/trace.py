"""Replay runs as canonical traces: their run id, their run record, and writing/ingesting them.

A replay trace is an ordinary canonical trace (docs/canonical-format.md) written by the
simulator's conventions (one ``run`` record, the steps, the requests with token
times), so ``tracelat ingest`` loads it like any other run. Its run id says what
it is: ``RUN~replay~<policy>-seed<k>`` where ``<policy>`` is ``recorded`` or the
changed fields (``mbt512``, ``mns16``, ``kv50000``, ``kvb16``, ``nochunk``/``chunk``,
``nofullprompt``/``fullprompt``, ``noprefix``/``prefix``), after the hardware what-ifs (``kvdtfp8``,
``compute2x``), with ``-okonly`` for a replay of the ok requests alone, ``-workload<hex>`` for
another workload (eight hex digits of its requests' digest) and ``-nonoise`` for a replay without noise. Its ``meta.replay`` records the source
run, the policy (and what changed), the calibrated model and noise, the seed and
the time origin; its ``dtype`` and ``kv_dtype`` are the source run's, with the KV dtype
of a ``--kv-dtype`` what-if (:func:`replay_dtypes`). Requests keep their recorded ids;
``recorded_status`` (an extra field) keeps their status in the recording.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ..sim import SimResult
from ..sim.workload import Workload
from ..sim.writer import write_trace
from .calibrate import Calibration
from .whatif import tag as whatif_tag

SEP = "~replay~"
TAGS = {"max_num_seqs": "mns", "max_num_batched_tokens": "mbt", "kv_capacity_tokens": "kv", "kv_block_size": "kvb"}
BOOLS = {"chunked_prefill": "chunk", "admit_full_prompt": "fullprompt", "prefix_caching": "prefix"}


def policy_tag(cal: Calibration) -> str:
    """``recorded`` or the changed policy fields in short form (``mbt512-mns16``)."""
    parts = []
    for f, v in cal.policy_changes().items():
        if f in BOOLS:
            parts.append(BOOLS[f] if v else "no" + BOOLS[f])
        else:
            parts.append(f"{TAGS[f]}{v}")
    return "-".join(whatif_tag(cal.whatif) + parts) or "recorded"


def replay_run_id(cal: Calibration, seed: int) -> str:
    """The run id of one replay of ``cal.run_id``."""
    noise = "-nonoise" if cal.details.get("noise_mode") == "none" else ""
    chosen = cal.details.get("iteration_model_option") or "auto"
    model = "" if chosen == "auto" else f"-{chosen}"  # a model named on the command line is a different replay
    # other requests make another replay: under one id, ingesting one would replace the other
    ok_only = "-okonly" if cal.details.get("ok_only") and cal.workload_source is None else ""
    workload = f"-workload{workload_digest(cal.workload)}" if cal.workload_source is not None else ""
    return f"{cal.run_id}{SEP}{policy_tag(cal)}{model}{ok_only}{workload}{noise}-seed{seed}"


def workload_digest(w: Workload) -> str:
    """Eight hex digits naming a workload by its requests (arrivals, lengths, cached tokens, hashes)."""
    h = hashlib.sha256()
    for a in (w.t_arrival, w.prompt_tokens, w.output_tokens, w.cached_tokens, w.hash_offsets, w.hash_values):
        h.update(b"-" if a is None else np.ascontiguousarray(a).tobytes() + b"|")
    return h.hexdigest()[:8]


def replay_meta(cal: Calibration, seed: int, result: SimResult) -> dict[str, Any]:
    """``meta.replay`` of a replay run."""
    return {
        "replay_of": cal.run_id,
        "policy": cal.policy.to_dict(),
        "recorded_policy": dict(cal.baseline_policy),
        "changed": cal.policy_changes(),
        "what_if": cal.whatif,
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
    sql = "select model, gpu, dtype, kv_dtype from runs where run_id = ?"
    rows = con.execute(sql, [run_id]).fetchall() if con else []
    return dict(zip(("model", "gpu", "dtype", "kv_dtype"), rows[0])) if rows else {}


def replay_dtypes(cal: Calibration, src: dict[str, Any]) -> dict[str, str | None]:
    """``dtype`` and ``kv_dtype`` of a replay's run record: the KV dtype it ran with.

    The source run's weights dtype; the KV dtype of the ``--kv-dtype`` what-if, else the one
    given by ``--recorded-kv-dtype``, else the source run's (``auto`` stays ``auto``: the dtype
    is copied with it). A replay of the replay then starts from the dtype it ran with, so a
    second ``--kv-dtype fp8`` is a no-op rather than halving ``a`` again.
    """
    rec = cal.details.get("kv_dtype") or {}
    if "kv_dtype" in cal.whatif:
        kv = cal.whatif["kv_dtype"]["kv_dtype"]
    elif rec.get("source") == "--recorded-kv-dtype":
        kv = rec["recorded"]
    else:
        kv = src.get("kv_dtype")
    return {"dtype": src.get("dtype"), "kv_dtype": kv}


def write_replay(
    result: SimResult, path, run_id: str, cal: Calibration, seed: int, con=None, with_token_times: bool = True
) -> Path:
    """Write one replay as canonical JSON Lines (gzip when the name ends in ``.gz``)."""
    src = _source_run(con, cal.run_id)
    recorded = np.asarray(cal.recorded_status[: result.n_requests]).astype(str)
    return write_trace(
        result,
        path,
        run_id,
        policy=cal.policy,
        model=cal.model,
        noise=cal.noise,
        workload_info=cal.workload.describe(),
        with_token_times=with_token_times,
        model_name=src.get("model") or "replayed",
        gpu=src.get("gpu") or "simulated",
        meta_extra={"replay": replay_meta(cal, seed, result)},
        request_columns={"recorded_status": recorded},
        run_fields=replay_dtypes(cal, src),
    )


def drop_replay(con, run_id: str) -> int:
    """Delete the stored rows of an earlier replay with this run id; the number of ingests removed.

    Only ingests that hold nothing but replay runs are touched, so a recorded run is
    never deleted. A replay is derived data: ``tracelat replay`` recreates it.
    """
    from .. import store

    if SEP not in run_id:
        raise ValueError(f"{run_id!r} is not a replay run id")
    which = (
        "select ingest_id from ingests where list_contains(run_ids, $rid) "
        "and len(list_filter(run_ids, lambda r: not contains(r, $sep))) = 0"
    )
    ids = [r[0] for r in con.execute(which, {"rid": run_id, "sep": SEP}).fetchall()]
    if not ids:
        return 0
    runs = [
        r[0]
        for r in con.execute(
            "select distinct unnest(run_ids) from ingests where ingest_id = any($ids)", {"ids": ids}
        ).fetchall()
    ]
    with store.transaction(con):
        for table in (t for t in store.INGEST_TABLES if t != "ingests"):
            con.execute(f"delete from {store.quote_ident(table)} where ingest_id = any($ids)", {"ids": ids})
        con.execute("delete from ingests where ingest_id = any($ids)", {"ids": ids})
        store.bump_generation(con, runs)
    return len(ids)


def ingest_replay(con, path: Path, run_id: str) -> list[str]:
    """Ingest a written replay into the store, replacing an earlier replay of the same id; its run ids."""
    from .. import ingest, store

    drop_replay(con, run_id)
    results = ingest.ingest_paths(con, [path], fmt="jsonl", replace=True)
    store.build_derived(con)
    return sorted({r for res in results for r in res.run_ids})
