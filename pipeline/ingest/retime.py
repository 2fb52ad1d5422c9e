"""Re-timing steps rebuilt from whole-second log stamps with a client's precise token times.

vLLM's default log stamps steps to the second, so their timeline is rebuilt from
elapsed times (``engines/_common.reconstruct_ends``) and can be off by hundreds of
milliseconds between second boundaries: enough to put a request's first token in
the wrong step.  A client that recorded every streamed token (one per step, on a
``perf_counter`` clock) has the exact times: the server's decode tokens, counted
back from the last step of the client's span, are the client's decode tokens in
order, so step ``i`` ends when the client received token number ``Y_i``
(``Y_i`` = the client's token count minus the server's decode tokens after step
``i``).  The offset between the clocks is then pinned by the stamps themselves:
every step end must lie inside its logged second, which leaves an interval of
offsets a few milliseconds wide once the run crosses a few hundred second
boundaries.

Used only when the counts agree (the server served this client and nothing else in
that span, tokens arrive one per step), or when the log holds only part of the
client's span (cut at its start or its end: the count runs from the end it holds);
otherwise the rebuilt timeline stays and the run says why.  A step's decode tokens are
capped at its decode requests (vLLM once logged 87 generation tokens for 4 requests on the step after a preemption;
without speculative decoding each request makes one).  Steps without decode tokens keep their distance to the next
re-timed step.  Undone by rebuilding the timeline from the stamps again.
"""

from __future__ import annotations

import duckdb
import numpy as np

from . import clocks

MAX_COUNT_MISMATCH = 0.02
GIVEN_SLACK_S = 1e-3  # how far outside the stamps' interval a given offset may lie unremarked


def _rebuild(stamp: np.ndarray, dur_ms: np.ndarray) -> np.ndarray:
    """The converter's timeline (same formula as ``_common.reconstruct_ends``, whole-second stamps)."""
    cum = np.cumsum(np.nan_to_num(dur_ms)) / 1000.0
    lower = np.maximum.accumulate(stamp - cum)
    upper = np.minimum.accumulate((stamp + 1.0 - cum)[::-1])[::-1]
    return cum + (lower + np.maximum(lower, upper)) / 2.0


def ids(ingest_id: int | list[int]) -> list[int]:
    """One log file's ingest id, or the ids of the pieces of one log (a rotated log's files)."""
    return [int(i) for i in ingest_id] if isinstance(ingest_id, (list, tuple)) else [int(ingest_id)]


def _load(con, run_id: str, ingest_id: int | list[int]) -> dict:
    """The steps of the file(s), in log order: pieces of one log in the order of their stamps."""
    return con.execute(
        "select iter, line_no, dur_ms, least(decode_tokens, coalesce(decode_reqs, decode_tokens))::double as y, "
        "try_cast(json_extract(extra, '$.stamp_s') as double) as stamp from iterations "
        "where run_id = $run and ingest_id = any($ing) "
        "order by min(try_cast(json_extract(extra, '$.stamp_s') as double)) over (partition by ingest_id), "
        "ingest_id, line_no",
        {"run": run_id, "ing": ids(ingest_id)},
    ).fetchnumpy()


def _write(
    con, run_id: str, ingest_id: int | list[int], iters: np.ndarray, t_end: np.ndarray, dur_ms: np.ndarray
) -> None:
    import pyarrow as pa

    tab = pa.table({"iter": iters, "t_end": t_end, "t_start": t_end - np.nan_to_num(dur_ms) / 1000.0})
    con.register("_retimed", tab)
    try:
        con.execute(
            "update iterations i set t_end = r.t_end, t_start = r.t_start from _retimed r "
            "where i.run_id = $run and i.ingest_id = any($ing) and i.iter = r.iter",
            {"run": run_id, "ing": ids(ingest_id)},
        )
    finally:
        con.unregister("_retimed")


def undo(con: duckdb.DuckDBPyConnection, run_id: str, ingest_id: int | list[int]) -> None:
    """Put a re-timed source's steps back on the timeline rebuilt from its stamps (each file's
    own, as the converter rebuilt it)."""
    for ing in ids(ingest_id):
        a = _load(con, run_id, ing)
        if len(a["iter"]) and np.all(np.isfinite(np.ma.filled(a["stamp"], np.nan))):
            _write(
                con,
                run_id,
                ing,
                a["iter"],
                _rebuild(np.asarray(a["stamp"], float), np.asarray(a["dur_ms"], float)),
                np.asarray(a["dur_ms"], float),
            )


MAX_SHIFT = 8  # tokens: how far lost or repeated step lines may move the count, tried both ways
MIN_SPLIT_GAIN = 0.1  # a shift that changes at one step must fit the gaps this much better than one shift


def _gap_costs(count, y, x, dur, last, n_client, shifts) -> tuple[np.ndarray, np.ndarray]:
    """|client token gap - step duration| (s) per shift (rows) and step (columns), on the steps where
    every shift puts a client token at this step's end and the previous step's; and those steps."""
    idx = np.arange(len(y))
    base = (idx <= last) & (y > 0)
    ok = base & np.all([(count + s >= 1) & (count + s <= n_client) for s in shifts], axis=0)
    k = np.nonzero(ok[1:] & ok[:-1])[0] + 1
    cost = np.empty((len(shifts), len(k)))
    for row, s in enumerate(shifts):  # a handful of shifts, each vectorised over the steps
        c = (count + s).astype(np.int64)
        cost[row] = np.abs(x[c[k] - 1] - x[c[k - 1] - 1] - dur[k] / 1000.0)
    return cost, k


def _shift(count, y, x, dur, last, n_client, mismatch: int):
    """The client's token count at each step end, corrected when the counts disagree.

    The count runs back from the last step, so a step line lost at the end (a log copied while
    written) moves every step's token by its tokens, and one lost in the middle moves the steps
    before it. Each shift is scored by how well the client's token gaps match the steps' durations
    (a long prefill step is a long gap); one shift for all steps, or one before and one after a
    step, whichever fits clearly best. Returns (count, report)."""
    if mismatch == 0:
        return count, {}
    reach = min(mismatch + 1, MAX_SHIFT)
    shifts = np.arange(-reach, reach + 1)
    cost, k = _gap_costs(count, y, x, dur, last, n_client, shifts)
    if cost.shape[1] < 20:
        return count, {"count_mismatch_tokens": mismatch}
    total = cost.sum(axis=1)
    one = int(np.argmin(total + 1e-12 * np.abs(shifts)))  # ties: the smallest shift
    prefix = np.concatenate([np.zeros((len(shifts), 1)), np.cumsum(cost, axis=1)], axis=1)
    best = (total[one], one, one, 0)
    for a in range(len(shifts)):  # before the change point
        for b in range(len(shifts)):  # from it on
            if a != b:
                split = prefix[a, 1:-1] + (total[b] - prefix[b, 1:-1])  # change after column m
                m = int(np.argmin(split))
                if split[m] < best[0]:
                    best = (float(split[m]), a, b, m + 1)
    cost_best, a, b, m = best
    report = {"count_mismatch_tokens": mismatch, "count_shift": int(shifts[one])}
    shift = np.full(len(y), shifts[one])
    if a != b and cost_best < (1 - MIN_SPLIT_GAIN) * total[one]:
        at = int(k[m])  # first step of the second piece
        shift = np.where(np.arange(len(y)) < at, shifts[a], shifts[b])
        report.update(count_shift=int(shifts[a]), count_shift_after=int(shifts[b]), count_shift_from_step=at)
    return count + shift, report


# A log holding part of the client's span (cut at its start or its end):
MIN_CUT_CONTRAST = 1.5  # the other end's median gap cost must be this many times the chosen end's
CUT_MIN_STEPS = 100  # steps with a client token it must keep to be re-timed
CUT_MIN_FIRST_SHARE = 0.8  # of the client's first tokens inside it, on a step's end once re-timed
CUT_MAX_INTERVAL_STEPS = 4.0  # its stamps must pin the offset to this many median steps
CUT_REFINE = 32  # tokens its count may move as a whole (a few steps lost at its other end)


def _refine_cut(count, y, x, dur, last, n_client, cut: dict) -> np.ndarray:
    """The cut log's count moved as a whole by the shift whose token gaps fit the steps' durations
    best: a log cut at its start that also lost a few steps at its end (copied while written) has
    every step's token off by the tokens of those steps."""
    shifts = np.arange(-CUT_REFINE, CUT_REFINE + 1)
    cost, _ = _gap_costs(count, y, x, dur, last, n_client, shifts)
    if cost.shape[1] < 20:
        return count
    best = int(shifts[int(np.argmin(cost.sum(axis=1) + 1e-12 * np.abs(shifts)))])  # ties: the smallest
    if best:
        cut["count_shift"] = best
    return count + best


def _first_tokens_on_steps(first: np.ndarray, ends: np.ndarray, dur_ms: np.ndarray) -> float:
    """Share of the first tokens (on the steps' clock) inside the steps' span that lie within a
    quarter step (at least 1 ms) after or before a step's end; 1.0 when none lies inside."""
    ends = np.sort(ends)
    f = first[np.isfinite(first) & (first >= ends[0]) & (first <= ends[-1])]
    if not len(f) or len(ends) < 2:
        return 1.0
    tol = max(0.25 * _median_step(dur_ms), 1e-3)
    return float(np.mean(np.abs(clocks._nearest_residual(ends, f)) <= tol))


def _median_step(dur_ms: np.ndarray) -> float:
    """The median step duration (s)."""
    d = dur_ms[np.isfinite(dur_ms) & (dur_ms > 0)]
    return float(np.median(d)) / 1000.0 if len(d) else 0.0


def _cut_side(back, y, x, dur, first, last, n_client) -> tuple[np.ndarray, dict]:
    """The client's token count at each step end when the log holds only part of the client's span.

    Its steps served fewer decode tokens than the client received: the log was cut at its start
    (the tokens it misses came before its first step; counting back from the last step is right)
    or at its end (they came after its last; counting on from the first step is right). The end
    whose count makes the client's token gaps match the steps' durations clearly better wins;
    neither (lost lines throughout, another client's tokens) gives ``(back, {})``."""
    cum = np.cumsum(y)
    forward = cum - (cum[first - 1] if first > 0 else 0.0)
    # a log cut at its start has no steps before the client's span; one cut at its end no decode
    # steps after it
    plausible = (first == 0, not np.any(y[last + 1 :] > 0))
    median = []
    for count, ok in zip((back, forward), plausible):
        if not ok:
            median.append(np.inf)
            continue
        cost, _ = _gap_costs(count, y, x, dur, last, n_client, [0])
        median.append(float(np.median(cost)) if cost.shape[1] >= 20 else np.inf)
    if not np.isfinite(min(median)) or max(median) < MIN_CUT_CONTRAST * min(median):  # inf wins clearly
        return back, {}
    side = "start" if median[0] < median[1] else "end"
    return (back if side == "start" else forward), {
        "log_cut_at": side,
        "client_tokens_outside_log": int(round(n_client - float(np.sum(y[first : last + 1])))),
    }


def retime(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    ingest_id: int | list[int],
    req: clocks.Requests,
    al: clocks.Alignment,
    given: float | None = None,
) -> tuple[dict, float | None]:
    """Re-time the steps of source ``ingest_id`` from the client's tokens; returns (report, new offset or None).

    ``ingest_id``: one log file, or the ids of the pieces of one log (files of a rotated log), taken
    as one log in the order of their stamps.

    ``given``: the offset the user gave (``--clock-offset``): the steps are re-timed on it
    instead of on the middle of the interval the stamps allow, and the report says whether
    it lies in that interval."""
    x = req.decode_token_times
    if x is None or len(x) < 50:
        return {"retimed": False, "why": "the client has no per-token times"}, None
    a = _load(con, run_id, ingest_id)
    stamp = np.ma.filled(np.ma.asarray(a["stamp"], dtype=float), np.nan)
    if not len(stamp) or not np.all(np.isfinite(stamp)):
        return {"retimed": False, "why": "steps without log stamps"}, None
    dur = np.ma.filled(np.ma.asarray(a["dur_ms"], dtype=float), 0.0)
    y = np.ma.filled(np.ma.asarray(a["y"], dtype=float), 0.0)
    t_end = _rebuild(stamp, dur)
    x = np.sort(x)
    lo, hi = al.apply(np.array([req.t_arrival.min(), req.t_finish.max()]))
    inside = (t_end >= lo - 1.0) & (t_end <= hi + 1.0)
    if not inside.any():
        return {"retimed": False, "why": "no steps inside the client's span"}, None
    last = int(np.nonzero(inside & (y > 0))[0].max()) if np.any(inside & (y > 0)) else -1
    first = int(np.nonzero(inside)[0].min())
    n_client = len(x)
    after = np.cumsum(y[::-1])[::-1] - y  # decode tokens of later steps
    after = after - after[last] + 0.0 if last >= 0 else after
    count = n_client - after  # the client's running token count at each step's end
    served = float(np.sum(y[first : last + 1]))
    differ = {
        "retimed": False,
        "why": f"the server's decode tokens in the client's span ({served:.0f}) and the client's ({n_client}) differ",
    }
    if last < 0:
        return differ, None
    mismatch, cut = round(abs(served - n_client)), {}
    tolerated = MAX_COUNT_MISMATCH * n_client + 2
    if served > n_client + tolerated:  # the steps served more than this client: another's tokens in them
        return differ, None
    if served < n_client - MAX_SHIFT:  # more missing than lost lines explain: the log may be cut short
        count_cut, cut = _cut_side(count, y, x, dur, first, last, n_client)
        if cut:
            count, mismatch = count_cut, 0  # the missing tokens are the cut's, not lost step lines
            count = _refine_cut(count, y, x, dur, last, n_client, cut)
        elif served < n_client - tolerated:
            return differ, None
    count, shifted = _shift(count, y, x, dur, last, n_client, mismatch)
    shifted |= cut
    if "count_shift_from_step" in shifted:  # a position among the source's steps: name its iteration
        shifted["count_shift_from_step"] = int(a["iter"][shifted["count_shift_from_step"]])
    anchored = (np.arange(len(y)) <= last) & (y > 0) & (count >= 1) & (count <= n_client)
    if anchored.sum() < (CUT_MIN_STEPS if cut else 10):
        return {"retimed": False, "why": "too few steps to re-time"}, None
    x_end = np.full(len(y), np.nan)
    x_end[anchored] = x[(count[anchored] - 1).astype(np.int64)]
    # offsets the stamps allow: every anchored step ends inside its logged second
    lo_off = float(np.max(stamp[anchored] - x_end[anchored]))
    hi_off = float(np.min(stamp[anchored] + 1.0 - x_end[anchored]))
    if cut and (lo_off > hi_off or hi_off - lo_off > CUT_MAX_INTERVAL_STEPS * _median_step(dur)):
        # which end was cut is read from token gaps alone: only stamps that all agree on a narrow
        # offset confirm it (with too few seconds in the piece, or preempted requests making more than
        # one token a step, they do not)
        return {
            "retimed": False,
            "why": "the log holds part of the client's span, and its stamps do not confirm where it was cut",
        }, None
    if lo_off > hi_off:  # a few stamps disagree (latency at a second boundary): the bulk decides
        lo_off = float(np.quantile(stamp[anchored] - x_end[anchored], 0.99))
        hi_off = float(np.quantile(stamp[anchored] + 1.0 - x_end[anchored], 0.01))
        if lo_off > hi_off:
            return {"retimed": False, "why": "the client's token times do not fit the log's stamps"}, None
    # log lines are written a little after their step ends: a given offset a hair outside the
    # interval (an epoch-stamped log's own, say) is as good as one inside it
    slack = max(GIVEN_SLACK_S, hi_off - lo_off)
    fits = given is not None and lo_off - slack <= given <= hi_off + slack
    if cut and given is not None and not fits:
        # where the log was cut was read on this offset: one the stamps reject makes that reading unsafe
        return {
            "retimed": False,
            "why": "the log holds part of the client's span, and the given offset puts its steps outside "
            "their logged seconds",
        }, None
    offset = (lo_off + hi_off) / 2.0 if given is None else given
    # idle offset per step (end minus busy time so far), carried to steps without tokens
    cum = np.cumsum(dur) / 1000.0
    o = np.where(anchored, x_end + offset - cum, np.nan)
    idx = np.where(np.isfinite(o), np.arange(len(o)), len(o))
    nxt = np.minimum.accumulate(idx[::-1])[::-1]  # next anchored step (steps before it keep their distance)
    prev = np.maximum.accumulate(np.where(np.isfinite(o), np.arange(len(o)), -1))
    fill = np.where(nxt < len(o), o[np.minimum(nxt, len(o) - 1)], o[np.maximum(prev, 0)])
    o = np.where(np.isfinite(o), o, fill)
    outside = (np.arange(len(y)) < first) | (np.arange(len(y)) > last)
    new_end = np.where(outside, t_end, cum + o)
    if cut:
        # a log cut at both ends, or a cut end chosen wrongly, still fits its stamps (the count is off by
        # the same tokens everywhere) but puts the client's first tokens between steps: they land on a
        # step's end when the count is right
        share = _first_tokens_on_steps(req.t_first_token + offset, new_end[~outside], dur)
        cut["first_tokens_on_steps_share"] = round(share, 3)
        if share < CUT_MIN_FIRST_SHARE:
            return {
                "retimed": False,
                "why": f"the log holds part of the client's span, but counted from its {cut['log_cut_at']} only "
                f"{share:.0%} of the first tokens inside it land on a step's end (cut at both ends?)",
            }, None
    _write(con, run_id, ingest_id, a["iter"], new_end, dur)
    moved = np.abs(new_end - t_end)[~outside]
    how = {
        "retimed": True,
        "steps": int(anchored.sum()),
        "offset_interval_ms": round((hi_off - lo_off) * 1e3, 3),
        "median_move_ms": round(float(np.median(moved)) * 1e3, 3),
        "max_move_ms": round(float(np.max(moved)) * 1e3, 3),
        **shifted,
    }
    if given is not None:
        how["stamps_allow_s"] = [lo_off, hi_off]
        how["given_offset_fits_stamps"] = bool(fits)
    return how, offset
