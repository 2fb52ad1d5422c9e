"""Tail attribution (docs/model-and-attribution.md, sections 5 and 6): which parts of a latency grow in the tail, and who caused it.

The per-request split is ``request_attribution`` (``queries/fit/request_attribution.sql``,
materialised with the fit); this module compares the >= p99 group with the
p40-p60 group (``queries/fit/tail_parts.sql``), lists the steps that delayed the
tail requests most (``queries/fit/tail_iterations.sql``) and the worst requests,
optionally for requests arriving in a time window.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import duckdb

from .. import store
from ..errors import InputError

METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
PART_TEXT = {
    "waiting_hol": "waiting behind other requests' prefill (head-of-line blocking)",
    "waiting_capacity": "waiting for room in the batch or KV cache (capacity)",
    "waiting_step": "waiting for the step in progress to end (admission is at step boundaries)",
    "own_prefill": "computing its own prompt",
    "decode_baseline": "memory-bound decode at its batch's context",
    "prefill_interference": "other requests' prefill inside its decode steps",
    "preemption": "preempted (out of the batch, recomputed)",
    "unexplained": "unexplained stalls and host gaps (GC, host, noise)",
    "unattributed": "not attributable (no steps or timestamps cover it)",
}


def run_start(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """The run's first time: earliest arrival or step start."""
    return store.rows(con, "fit/run_span", {"run_id": run_id})[0][0]


# Clock values from here on are unix seconds (after 1973); smaller ones are a monotonic clock.
UNIX_CLOCK_MIN = 1e8


def run_end(con: duckdb.DuckDBPyConnection, run_id: str) -> float | None:
    """The run's last arrival or step end: the latest a --to window bound can matter."""
    return store.rows(con, "fit/run_span", {"run_id": run_id})[0][1]


def run_zone(con: duckdb.DuckDBPyConnection, run_id: str) -> str:
    """The zone the run's log stamps were read in (``--tz`` at ingest, or the machine's zone
    then), which is how the user reads times off the log; UTC for runs without wall-clock stamps."""
    import zoneinfo

    zone = store.scalar(con, "select meta->>'$.timestamps_time_zone' from runs where run_id = ?", [run_id])
    name = str(zone or "UTC").split(" ")[0]
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "UTC"
    return name


def check_window(
    con: duckdb.DuckDBPyConnection, run_id: str, lo: float, hi: float, t_from: str | None, t_to: str | None
) -> None:
    """A reversed window, or one that misses the run entirely, is a mistake to say, not an
    empty answer to print."""
    if lo > hi:
        raise InputError(f"--from {t_from} is after --to {t_to}; give the earlier time as --from")
    start, end = run_start(con, run_id), run_end(con, run_id)
    if start is None or end is None:
        return
    unix = start >= UNIX_CLOCK_MIN
    span = f"{show_time(start, start, unix)} .. {show_time(end, start, unix)}"
    zone = run_zone(con, run_id)
    if unix and zone not in ("UTC", "Etc/UTC", "Etc/Universal", "Universal", "GMT", "Etc/GMT", "Zulu"):
        # the times the user reads off the log
        span += f"; in {zone}, the log's zone: {_wall(start, zone)} .. {_wall(end, zone)}"
    if lo > end:
        raise InputError(f"--from {t_from} lies after the run's end (the run spans {span})")
    if hi < start:
        raise InputError(f"--to {t_to} lies before the run's start (the run spans {span})")


def show_time(t: float | None, start: float | None, unix: bool) -> str:
    """A clock value for people: ISO time in UTC with its zone on unix clocks, and seconds
    since the run's start (``+12.345 s``); never a bare epoch number or ``None``."""
    if t is None:
        return "-"
    rel = f"+{t - start:.3f} s" if start is not None else f"{t:.3f} s"
    if not unix:
        return rel
    iso = dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{iso} ({rel})"


def _wall(t: float, zone: str) -> str:
    import zoneinfo

    return dt.datetime.fromtimestamp(t, zoneinfo.ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S")


def parse_time(text: str | None, con: duckdb.DuckDBPyConnection, run_id: str, default: float) -> float:
    """A window bound on the run's clock (seconds).

    Accepts seconds since the run's start (``90``, ``1.5``), an absolute clock value
    (``@1700000123.5``), or, for unix-clock runs, an ISO date-time or a time of day
    (``2024-05-01T14:03:00``, ``14:03``, ``14:03:30``; the run's start date) read in the
    zone of the run's log stamps (:func:`run_zone`: what the log shows), unless it names
    its own zone (``...Z``, ``...+02:00``).
    """
    import zoneinfo

    if text is None:
        return default
    s = text.strip()
    start = run_start(con, run_id) or 0.0
    try:
        t = float(s[1:]) if s.startswith("@") else start + float(s)
    except ValueError:
        t = None
    if t is not None:
        if not math.isfinite(t):  # "nan", "inf": float() takes them, no window can
            raise InputError(f"time {text!r}: not a finite number of seconds")
        return t
    zone = zoneinfo.ZoneInfo(run_zone(con, run_id))
    try:
        if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?", s):
            # the day of the run's start, or the next one for a run over midnight: whichever
            # puts the time nearer the run (00:00:01 of a run from 23:59:57 is the next day's)
            day = dt.datetime.fromtimestamp(start, zone).date()
            end = run_end(con, run_id) or start
            at = [dt.datetime.combine(day + dt.timedelta(days=k), dt.time.fromisoformat(s), zone) for k in (0, 1)]
            t = min(at, key=lambda x: max(start - x.timestamp(), x.timestamp() - end, 0.0))
        else:
            # Python 3.10's fromisoformat does not take the "Z" suffix that most tools print
            t = dt.datetime.fromisoformat(s[:-1] + "+00:00" if s[-1:] in ("Z", "z") else s)
            t = t if t.tzinfo else t.replace(tzinfo=zone)
    except (ValueError, OverflowError, OSError) as exc:
        raise InputError(
            f"time {text!r}: not seconds since the run's start, @<clock seconds>, an ISO date-time or HH:MM[:SS]"
        ) from exc
    if start < UNIX_CLOCK_MIN:
        raise InputError(f"time {text!r}: the run's clock is not unix time; give seconds since its start instead")
    return t.timestamp()


def _top_requests(con, run_id: str, metric: str, t_from: float, t_to: float, limit: int) -> list[dict]:
    params = {"run_id": run_id, "metric": metric, "t_from": t_from, "t_to": t_to, "limit": limit}
    return store.select(con, "fit/tail_top_requests", params).to_dicts()


def _outside_steps(con, run_id: str, t_from: float, t_to: float) -> list[str]:
    """Where the log's steps stop short of the requests: how many fall outside, and the window
    (``--from`` / ``--to``, seconds since the run's start) that keeps to the steps."""
    params = {"run_id": run_id, "t_from": t_from, "t_to": t_to}
    before, after, first, last = store.rows(con, "fit/tail_outside_steps", params)[0]
    if not before and not after:
        return []
    start = run_start(con, run_id)
    unix = start is not None and start >= UNIX_CLOCK_MIN
    out = []
    if after:
        out.append(
            f"{after} request{'s end' if after > 1 else ' ends'} after the log's last step "
            f"({show_time(last, start, unix)}): the log was cut short or the client ran on; "
            f"--to {last - start:.3f} keeps to requests that arrive while it runs"
        )
    if before:
        out.append(
            f"{before} request{'s' if before > 1 else ''} got {'their' if before > 1 else 'its'} first token "
            f"before the log's first step ({show_time(first, start, unix)}): the log starts late; "
            f"--from {first - start:.3f} keeps to requests that arrive after it starts"
        )
    return out


def _coverage(con, run_id: str, t_from: float, t_to: float) -> list[str]:
    """Sentences on what could not be attributed."""
    row = store.rows(con, "fit/tail_coverage", {"run_id": run_id, "t_from": t_from, "t_to": t_to})[0]
    n, no_sched, ua, counted, unknown, bursty = row
    notes = []
    if n and no_sched:
        notes.append(
            f"{no_sched} of {n} requests have no scheduled time: their waiting and own prefill "
            "are not split (counted as unattributed)"
        )
    if ua and ua > 0.01:
        notes.append(f"{ua:.0%} of the requests' end-to-end time is not covered by fitted steps (unattributed)")
        notes += _outside_steps(con, run_id, t_from, t_to)
    if counted:
        notes.append(
            f"{counted} preempted requests have no token times, or got them in bursts: their preemption "
            "time is estimated from the number of steps they sat out"
        )
    if unknown:
        notes.append(f"{unknown} preempted requests could not be priced (bug or missing data)")
    if bursty:
        notes.append(
            f"{bursty} of {n} requests have no preemption counts and got their tokens in bursts, not one per step: "
            "whether they sat out steps cannot be told from the gaps, so none of their time is put on preemption"
        )
    return notes


def _join_doubts(con, run_id: str) -> list[str]:
    """What the ingest said against the join of this run's files (a given offset the steps do not
    bear out, a client whose requests the steps do not follow): the shares below rest on it."""
    from ..ingest.align import source_lines

    return [text for _, text in source_lines(run_id, store.run_meta(con, run_id), doubts_only=True)]


def _without_steps(con, params: dict) -> list[str]:
    """For a run without steps (every part unattributed): say so first, and what the requests'
    own timestamps show, the wait for a batch in the tail and median groups."""
    if store.scalar(con, "select count(*) from iterations where run_id = $r", {"r": params["run_id"]}):
        return []
    notes = [
        "the run has no steps (iteration records), which every part but unattributed needs: ingest the "
        "server's per-step log with --run-id of this run"
    ]
    if params["metric"] == "tpot":
        return notes
    row = store.rows(con, "fit/tail_waiting", params)[0]
    tail_q, tail_v, med_q, med_v = row
    if tail_q is not None and tail_v and med_v:
        name = params["metric"].upper()
        notes.append(
            f"from the timestamps alone: the wait for a batch (t_scheduled - t_arrival) is {tail_q / tail_v:.1%} of "
            f"the tail group's mean {name} ({tail_q:,.1f} of {tail_v:,.1f} ms) and {med_q / med_v:.1%} of the "
            f"median group's ({med_q:,.1f} of {med_v:,.1f} ms)"
        )
    return notes


def explain(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    metric: str,
    t_from: float = -math.inf,
    t_to: float = math.inf,
    limit: int = 10,
) -> dict[str, Any]:
    """Tail attribution of ``metric`` (ttft, tpot, e2e) over requests arriving in [t_from, t_to].

    The fit (``iteration_fit``, ``request_attribution``) must exist: call
    :func:`pipeline.fit.get_or_fit` first.
    """
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    from ..ingest.align import coarse_steps_problem, cross_clock_problem

    problem = cross_clock_problem(con, run_id)
    if problem:
        raise InputError(
            f"{problem}; tail attribution needs steps and requests on one clock: pass "
            "--clock-offset SOURCE=SECONDS at ingest, or check that the files belong to one run"
        )
    coarse = coarse_steps_problem(con, run_id)
    doubts = _join_doubts(con, run_id)
    params = {"run_id": run_id, "metric": metric, "t_from": t_from, "t_to": t_to, "limit": limit}
    parts = store.select(con, "fit/tail_parts", params)
    start = run_start(con, run_id)
    out: dict[str, Any] = {
        "run_id": run_id,
        "metric": metric,
        "unit": "ms per output token" if metric == "tpot" else "ms",
        "window": {"from": t_from if math.isfinite(t_from) else None, "to": t_to if math.isfinite(t_to) else None},
        # for showing times: seconds since the start, and wall time on unix clocks
        "run_start": start,
        "clock_is_unix": start is not None and start >= UNIX_CLOCK_MIN,
        # what makes the shares below unreliable, said before them
        "warnings": ([coarse] if coarse else []) + doubts,
    }
    if parts.height == 0 or parts["n"][0] == 0:
        out.update(
            requests=0,
            parts=[],
            largest=None,
            top_iterations=[],
            top_requests=[],
            statements=[
                f"no requests with a {metric} value in this window"
                if math.isfinite(t_from) or math.isfinite(t_to)
                else f"the run has no requests with a {metric} value (steps only?): nothing to attribute"
            ],
        )
        return out
    first = parts.row(0, named=True)
    out.update(
        requests=first["n"],
        p50=first["p50"],
        p99=first["p99"],
        tail_requests=first["n_tail"],
        median_requests=first["n_median"],
    )
    rows = parts.select("part", "tail_mean_ms", "median_mean_ms", "growth_ms", "share").to_dicts()
    for r in rows:
        r["meaning"] = PART_TEXT.get(r["part"], "")
    out["parts"] = rows
    out["largest"] = rows[0]["part"] if rows and (rows[0]["growth_ms"] or 0) > 0 else None
    out["top_iterations"] = store.select(con, "fit/tail_iterations", params).to_dicts()
    out["top_requests"] = _top_requests(con, run_id, metric, t_from, t_to, limit)
    notes = _coverage(con, run_id, t_from, t_to)
    notes += _without_steps(con, params)
    if first["n_tail"] < 5:
        k = first["n_tail"]
        notes.append(f"the tail group holds only {k} request{'' if k == 1 else 's'}: shares are noisy")
    out["statements"] = notes
    return out


def tail_section(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[str, float]]:
    """The ``tail`` section of the summary: ``{metric: {part: share}}`` over the whole run
    (empty when the run's steps and requests could not be put on one clock)."""
    from ..ingest.align import cross_clock_problem

    out: dict = {}
    if cross_clock_problem(con, run_id):
        return out
    for metric in METRICS:
        df = store.select(
            con, "fit/tail_parts", {"run_id": run_id, "metric": metric, "t_from": -math.inf, "t_to": math.inf}
        )
        out[metric] = {r["part"]: r["share"] for r in df.to_dicts()} if df.height and df["n"][0] else {}
    return out
