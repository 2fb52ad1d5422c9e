"""Request sources of one run on one clock, aligned together (a post-ingest step of :mod:`.align`).

Two clients driving one server (two ``vllm bench`` processes on one host) each saw part of
the load, so neither alone matches the steps' batch sizes: their requests are put back on
the clock they share and aligned as one set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..store import scalar
from .align import MAX_UNIX_GAP_S, _requests, _same_requests, _steps, _transform

if TYPE_CHECKING:
    from . import clocks


def _origin(con, run_id: str, ing: int, clock: str) -> float | None:
    """Where a source's times start on its clock: 0 for Unix times, the ``perf_counter`` origin a
    converter subtracted (``meta.perf_counter_origin_s``) for a monotonic one, None when unknown."""
    if clock == "unix":
        return 0.0
    v = scalar(
        con,
        "select max(try_cast(json_extract(meta, '$.perf_counter_origin_s') as double)) from run_records "
        "where run_id = ? and ingest_id = ?",
        [run_id, ing],
    )
    return None if v is None else float(v)


def align_joint(
    con, run_id: str, others: list, ref_clock: str, steps: clocks.Steps, retime_ref: int | None = None
) -> dict[int, dict]:
    """One alignment for every request source of the run that shares one clock: ``{ingest_id: entry}``.

    Two clients driving one server (two ``vllm bench`` processes on one host) each saw part of
    the load, so neither alone matches the steps' batch sizes.  Sources are taken together when
    none has a given offset, all carry one kind of clock, each one's origin on it is known, and
    their spans on it overlap or touch (the union no longer than the spans added up: clients of
    one run on one clock; another host's monotonic clock lies anywhere); not when two of them
    hold the same requests.  Their requests are put back on the shared clock, the offset is
    estimated once, and each source gets it less its own origin.  Empty when that is not the
    case or the joint estimate is refused (each source is then aligned on its own).
    ``retime_ref``: steps rebuilt from whole-second stamps, re-timed from all the sources' tokens.
    """
    import numpy as np

    from . import clocks, retime

    if len(others) < 2 or any(o[5] is not None for o in others):
        return {}
    kinds = {o[4] or "unix" for o in others}
    if len(kinds) != 1:
        return {}
    clock = kinds.pop()
    origins = [_origin(con, run_id, o[0], clock) for o in others]
    if any(x is None for x in origins):
        return {}
    reqs = [_requests(con, run_id, o[0]) for o in others]
    if any(len(r.t_first_token) == 0 for r in reqs):
        return {}
    lo = [float(np.nanmin(r.t_arrival)) + x for r, x in zip(reqs, origins)]
    hi = [float(np.nanmax(r.t_finish)) + x for r, x in zip(reqs, origins)]
    if not all(np.isfinite(lo + hi)) or max(hi) - min(lo) > sum(h - low for h, low in zip(hi, lo)):
        return {}
    base = origins[0]
    shifts = [x - base for x in origins]  # each source onto the first one's times
    for i in range(len(others)):
        for j in range(i + 1, len(others)):
            pair = ((others[i][0], others[i][1]), (others[j][0], others[j][1]))
            if _same_requests(con, run_id, *pair, shifts[i], shifts[j]):
                return {}

    def cat(get) -> np.ndarray | None:
        parts = [get(r) for r in reqs]
        if any(p is None for p in parts):
            return None
        return np.concatenate([p + sh for p, sh in zip(parts, shifts)])

    joint = clocks.Requests(
        cat(lambda r: r.t_arrival),
        cat(lambda r: r.t_first_token),
        cat(lambda r: r.t_finish),
        cat(lambda r: r.token_times),
        cat(lambda r: r.decode_token_times),
    )
    al = clocks.estimate(steps, joint)
    if not al.ok or (clock == ref_clock == "unix" and abs(al.offset_s) > MAX_UNIX_GAP_S):
        return {}
    # two Unix clocks within a step of each other agree, as for one source (align._align_source)
    dur = steps.t_end - steps.t_start
    step_s = float(np.median(dur)) if len(dur) else 0.0
    same = (
        clock == ref_clock == "unix"
        and al.drift == 0.0
        and abs(al.offset_s) <= max(3e-3 * (al.uncertainty_ms or 0.0), step_s)
    )
    extra: dict = {}
    if same:
        extra = {
            "estimated_offset_s": round(al.offset_s, 9),
            "note": "both clocks are unix and agree within a step time: no offset applied",
        }
        al = replace(al, offset_s=0.0)
    elif retime_ref is not None and al.drift == 0.0:
        how, offset = retime.retime(con, run_id, retime_ref, joint, al)
        extra["retime"] = how | {"ingest_id": retime_ref} if how.get("retimed") else how
        if offset is not None:
            before = al.offset_s
            steps = _steps(con, run_id, retime.ids(retime_ref))
            al = clocks.assess(steps, joint, clocks.Alignment(True, offset, 0.0, al.pivot_s, requests=al.requests))
            extra.update(offset_before_retime_s=before, uncertainty_ms=round(how["offset_interval_ms"] / 2, 3))
    paths = [o[1] for o in others]
    ings = [o[0] for o in others]
    fig = {k: v for k, v in al.to_dict().items() if k not in ("ok", "offset_s", "pivot_s")}
    out: dict[int, dict] = {}
    for o, sh, r in zip(others, shifts, reqs):
        # t_ref = t_joint + offset + drift (t_joint - pivot), with t_joint = t + sh
        offset, pivot = al.offset_s + sh, al.pivot_s - sh
        if not same:
            _transform(con, run_id, o[0], offset, al.drift, pivot, inverse=False)
        out[o[0]] = (
            {"path": o[1], "clock": clock}
            | fig
            | extra
            | {
                "offset_s": round(offset, 9),
                "pivot_s": round(pivot, 9),
                "requests": len(r.t_first_token),
                "status": "same clock" if same else "aligned",
                "applied": not same,
                "method": f"together with {', '.join(p for p in paths if p != o[1])} (one clock: its origin "
                f"{sh:+.6f} s from the first's)",
                "together_with": [p for p in paths if p != o[1]],
                "joint_requests": al.requests,
                "joint_ingests": ings,
            }
        )
    return out
