"""Post-ingest step: put every source of a run on the clock of its steps, and infer scheduling.

A run assembled from several files (a server log plus a client's request records)
has one *reference* source, the file(s) holding its steps, and *request sources*,
files holding requests but no steps.  Each request source gets an alignment
(:mod:`pipeline.ingest.clocks`): estimated from the data, or given with
``--clock-offset SOURCE=SECONDS``.  Its requests' and tokens' times are rewritten in
place onto the reference clock, and the transform is kept in ``clock_alignments`` so
that the next ingest touching the run can undo it and estimate again from scratch
(a source added or replaced changes the answer).

Rules:

* Request sources on ``monotonic`` clocks (or on another clock than the steps) are
  always aligned; two ``unix`` sources only when the estimated offset is larger than
  three times its uncertainty (a client with a synchronised clock is left as it is).
* Several request sources on one clock (clients of one run on one host) are aligned
  together (:mod:`pipeline.ingest.align_joint`): alone, each explains only part of the steps' load.
* A source that cannot be aligned is left on its clock and the run says why
  (``meta.clock_alignment.status = 'failed'``); every quantity that would span two
  clocks is then refused (:func:`cross_clock_problem`).
* Once aligned, what the request records lack is inferred from the steps (see
  :func:`_infer`), only where the whole source lacks it, and listed in
  ``meta.inferred``: ``t_scheduled`` (the step where its prefill began, by prefill
  token accounting anchored at the step that produced its first token) and
  ``preemptions`` (token gaps in which the request sat out steps).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING

import duckdb

from ..errors import InputError
from .canonical_sql import MAX_ABS_TIME_S
from .. import store
from ..store import scalar

if TYPE_CHECKING:  # numpy and the estimators load only for runs with a request source to align
    import numpy as np

    from . import clocks

SOURCES = """
with it as (select ingest_id, count(*) as n from iterations where run_id = $run group by ingest_id),
     rq as (select ingest_id, count(*) as n from requests where run_id = $run group by ingest_id),
     clk as (select ingest_id, arg_max(clock, line_no) filter (clock is not null) as clock
             from run_records where run_id = $run and ingest_id is not null group by ingest_id)
select i.ingest_id, i.path, coalesce(it.n, 0) as n_iter, coalesce(rq.n, 0) as n_req, clk.clock,
       (select any_value(offset_s) from clock_overrides o where o.path = i.path and o.run_id = $run) as override_s
from ingests i left join it using (ingest_id) left join rq using (ingest_id) left join clk using (ingest_id)
where it.n > 0 or rq.n > 0
order by i.ingest_id
"""

TIME_COLS = ("t_arrival", "t_scheduled", "t_first_token", "t_finish")


def set_overrides(
    con: duckdb.DuckDBPyConnection,
    overrides: dict[str, float],
    reloaded: dict[str, list[str]],
    runs_of: dict[str, list[str]] | None = None,
) -> tuple[list[str], dict[str, list[str]]]:
    """Remember ``--clock-offset PATH=SECONDS`` for the runs the file at PATH was loaded into (or
    found in) by this command, ``runs_of[PATH]`` (default: every run that holds the path); kept for
    later re-alignments of those runs, never for another run that loads or holds the same path. And
    forget the offsets of ``reloaded`` files (path -> the runs it held or holds) given none this
    time: a file loaded again is estimated again unless its offset is given again.

    Returns the runs whose offset changed (they are aligned again even when no file changed) and,
    per path of ``overrides``, the runs its offset now holds for."""
    changed: set[str] = set()
    applied: dict[str, list[str]] = {}
    for path, runs in reloaded.items():
        if path not in overrides and runs:
            gone = con.execute(
                "delete from clock_overrides where path = $p and run_id = any($r) returning run_id",
                {"p": path, "r": runs},
            ).fetchall()
            changed.update(r[0] for r in gone)
    for path, off in overrides.items():
        runs = (
            sorted(set(runs_of[path]))
            if runs_of is not None and path in runs_of
            else [
                r[0]
                for r in con.execute(
                    "select distinct unnest(run_ids) from ingests where path = ? order by 1", [path]
                ).fetchall()
            ]
        )
        con.execute("delete from clock_overrides where path = $p and run_id = any($r)", {"p": path, "r": runs})
        con.execute(
            "insert into clock_overrides select $p, $o, unnest($r::varchar[])", {"p": path, "o": off, "r": runs}
        )
        changed.update(runs)
        applied[path] = runs
    return sorted(changed), applied


def _same_file(a: str, b: str) -> bool:
    """Whether two spellings name one file (``./x``, ``dir/../x``, an absolute path, a link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (or cannot be looked at): no match by this rule
        return False


def parse_offsets(items: tuple[str, ...], paths: list[str]) -> dict[str, float]:
    """``SOURCE=SECONDS`` options to ``{path: seconds}``; SOURCE is a path or a file name among ``paths``."""
    out: dict[str, float] = {}
    for item in items:
        src, sep, val = item.rpartition("=")
        if not sep or not src:
            raise InputError(f"--clock-offset {item!r}: expected SOURCE=SECONDS, e.g. bench.json=1796014047.94")
        try:
            off = float(val)
        except ValueError:
            raise InputError(f"--clock-offset {item!r}: {val!r} is not a number of seconds") from None
        if not math.isfinite(off) or abs(off) > MAX_ABS_TIME_S:
            raise InputError(
                f"--clock-offset {item!r}: the offset must be finite seconds, at most {MAX_ABS_TIME_S:.0e} "
                "(a Unix time is about 1.8e9)"
            )
        hits = [p for p in paths if p == src or p.endswith("/" + src) or p.split("/")[-1] == src or _same_file(p, src)]
        if len(hits) != 1:
            raise InputError(
                f"--clock-offset {item!r}: {src!r} matches {len(hits)} of the files ingested "
                f"({', '.join(paths[:5])}); name one file"
            )
        out[hits[0]] = off
    return out


def _transform(con, run_id: str, ingest_id: int, offset: float, drift: float, pivot: float, inverse: bool) -> None:
    """Rewrite one source's request and token times (or undo that)."""
    if inverse:  # t = (t' - offset + drift * pivot) / (1 + drift)
        expr = "({c} - $o + $d * $p) / (1 + $d)"
    else:
        expr = "{c} + $o + $d * ({c} - $p)"
    params = {"run": run_id, "ing": ingest_id, "o": offset, "d": drift, "p": pivot}
    sets = ", ".join(f"{c} = {expr.format(c=c)}" for c in TIME_COLS)
    con.execute(f"update requests set {sets} where run_id = $run and ingest_id = $ing", params)
    # the tokens view computes itl_ms from these times: a drift stretches each gap by (1 + drift)
    con.execute(
        f"update token_lists set t_s = list_transform(t_s, lambda t: {expr.format(c='t')}) "
        "where run_id = $run and ingest_id = $ing",
        params,
    )


def _undo(con, run_id: str) -> None:
    """Put every source of the run back on the times its file gave.

    A client's row outlives the client itself when its file was replaced or moved to another run
    (``--replace``): its requests are gone, but the steps it re-timed are still the run's and go
    back on their stamps' timeline all the same, else the next alignment starts from them."""
    rows = con.execute(
        "select a.ingest_id, a.offset_s, a.drift, a.pivot_s, a.applied, a.inferred, a.info, "
        "a.ingest_id in (select ingest_id from ingests) from clock_alignments a where a.run_id = $run",
        {"run": run_id},
    ).fetchall()
    import json

    for ing, off, drift, pivot, applied, inferred, info, present in rows:
        ref = (json.loads(info or "{}").get("retime") or {}).get("ingest_id")
        if ref is not None:
            from . import retime

            retime.undo(con, run_id, ref)  # nothing to do when the log too is gone
        if not present:
            continue
        for col in inferred or []:  # inferred values go before the times move back
            con.execute(f"update requests set {_col(col)} = null where run_id = ? and ingest_id = ?", [run_id, ing])
        if applied:
            _transform(con, run_id, ing, off, drift, pivot, inverse=True)
    con.execute("delete from clock_alignments where run_id = ?", [run_id])


def _col(name: str) -> str:
    if name not in ("t_scheduled", "preemptions"):
        raise ValueError(name)
    return name


def _steps(con, run_id: str, ref_ids: list[int]) -> clocks.Steps:
    from . import clocks

    a = con.execute(
        "select t_start, t_end, decode_reqs::double as d, prefill_tokens::double as p, "
        "decode_tokens::double as dt from iterations "
        "where run_id = $run and ingest_id = any($ids) and t_start is not null and t_end is not null "
        "order by t_end, iter",
        {"run": run_id, "ids": ref_ids},
    ).fetchnumpy()
    flags = con.execute(
        "select bool_or(coalesce(try_cast(json_extract(meta, '$.decode_lines_sampled') as boolean), false)), "
        "bool_or(coalesce(try_cast(json_extract(meta, '$.timestamps_reconstructed') as boolean), false)), "
        "bool_or(coalesce(try_cast(json_extract(meta, '$.timestamp_resolution_s') as double), 0) >= 0.5) "
        "from run_records where run_id = ? and ingest_id = any(?)",
        [run_id, ref_ids],
    ).fetchone()
    rebuilt = bool(flags[1])
    return clocks.Steps(
        a["t_start"],
        a["t_end"],
        _f(a["d"]),
        _f(a["p"]),
        bool(flags[0]),
        _f(a["dt"]),
        rebuilt,
        rebuilt or bool(flags[2]),
    )


def _f(x) -> np.ndarray:
    import numpy as np

    return np.ma.filled(np.ma.asarray(x, dtype=float), np.nan)


def _requests(con, run_id: str, ing: int) -> clocks.Requests:
    import numpy as np

    from . import clocks

    a = con.execute(
        "select t_arrival, t_first_token, t_finish from requests where run_id = $run and ingest_id = $ing "
        "and status = 'ok' and t_first_token is not null and t_finish is not null",
        {"run": run_id, "ing": ing},
    ).fetchnumpy()
    tk = con.execute(
        "select t, idx from tokens where run_id = $run and ingest_id = $ing", {"run": run_id, "ing": ing}
    ).fetchnumpy()
    t = _f(tk["t"]) if len(tk["t"]) else None
    return clocks.Requests(
        _f(a["t_arrival"]),
        _f(a["t_first_token"]),
        _f(a["t_finish"]),
        t,
        None if t is None else t[np.asarray(tk["idx"]) > 0],
    )


def align_clocks(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """POST_INGEST step (first of all): align the request sources of the touched runs."""
    from .load import DERIVED_CLOCKS, derive_run_meta

    for run_id in run_ids:
        had = scalar(con, "select count(*) from clock_alignments where run_id = ?", [run_id])
        _undo(con, run_id)
        sources = con.execute(SOURCES, {"run": run_id}).fetchall()
        refs = [s for s in sources if s[2] > 0]
        others = [s for s in sources if s[2] == 0 and s[3] > 0]
        if not refs or not others:
            if had:
                derive_run_meta(con, run_id, None, step=DERIVED_CLOCKS)
            continue
        ref_clock = next((s[4] for s in refs if s[4]), None) or "unix"
        steps = _steps(con, run_id, [s[0] for s in refs])
        # whole-second stamps and one client (or clients aligned together): the client's token
        # times can re-time the steps
        retime_cand = _retime_candidate(con, run_id, refs) if steps.reconstructed else None
        report, inferred_all = _align_sources(con, run_id, refs, others, ref_clock, steps, retime_cand)
        placed = [src[0] for src, e in zip(others, report) if e["status"] != "failed"]
        if (
            retime_cand is not None
            and len(others) > 1
            and len(placed) == 1
            and not any((e.get("retime") or {}).get("retimed") for e in report)
        ):
            # the other clients failed to align (files of another run, say): the one that fits is the
            # run's only client, aligned and allowed to re-time the steps as when it is given alone
            _undo(con, run_id)
            steps = _steps(con, run_id, [src[0] for src in refs])
            report, inferred_all = _align_sources(con, run_id, refs, others, ref_clock, steps, retime_cand, placed[0])
        zone = _stamps_zone(con, [s[0] for s in refs])
        for e in report:
            hours = _whole_hours(e, ref_clock) if zone else None
            if hours is not None:
                e["time_zone_suspect"] = {"hours": hours, "stamps_read_in": zone}
        failed = [e for e in report if e["status"] == "failed"]
        status = "failed" if failed else "aligned" if any(e["applied"] for e in report) else "same clock"
        meta = {
            "clock_alignment": {
                "status": status,
                "reference_clock": ref_clock,
                "reference": [s[1] for s in refs],
                "sources": report,
            },
            "inferred": sorted(inferred_all) or None,
        }
        if failed:
            meta["clock_alignment"]["problem"] = failed[0]["reason"]
        placed = [(s[0], s[1]) for s, e in zip(others, report) if e["status"] != "failed"]
        twins = [t for i, a in enumerate(placed) for b in placed[i + 1 :] if (t := _same_requests(con, run_id, a, b))]
        if twins:
            meta["clock_alignment"]["same_requests"] = twins
        derive_run_meta(con, run_id, meta, step=DERIVED_CLOCKS, clock=ref_clock)


# Time zones are whole quarter hours from UTC; two Unix clocks of one run agree within seconds (NTP),
# so an offset this close to a multiple of 15 minutes, an hour or more, is a log read in another zone.
ZONE_STEP_S = 900.0
ZONE_SLACK_S = 120.0


def _stamps_zone(con, ref_ids: list[int]) -> str | None:
    """The zone the steps' wall-clock stamps were read in (``--tz`` or this machine's), or None when
    their stamps named their own zone or were epoch seconds: only then can a wrong ``--tz`` move them."""
    return scalar(
        con,
        "select any_value(json_extract_string(meta, '$.timestamps_time_zone')) from run_records "
        "where ingest_id = any(?) and json_extract_string(meta, '$.timestamps_time_zone') is not null",
        [ref_ids],
    )


def _whole_hours(entry: dict, ref_clock: str) -> float | None:
    """The hours of a Unix client's offset from steps read in a time zone, when it looks like a zone's
    (a multiple of 15 minutes, within ZONE_SLACK_S, at least an hour), else None."""
    off = entry.get("offset_s")
    if entry.get("status") != "aligned" or entry.get("clock") != "unix" or ref_clock != "unix":
        return None
    if not isinstance(off, (int, float)) or abs(off) < 3600.0 - ZONE_SLACK_S:
        return None
    whole = round(off / ZONE_STEP_S) * ZONE_STEP_S
    return whole / 3600.0 if abs(off - whole) <= ZONE_SLACK_S else None


def _retime_candidate(con, run_id: str, refs) -> int | list[int] | None:
    """The steps' file to re-time: the only one, or the pieces of one log given as several files
    (a rotated log: the files' stamps follow one another, never interleave), or None."""
    if len(refs) == 1:
        return refs[0][0]
    ids = [r[0] for r in refs]
    spans = con.execute(
        "select ingest_id, min(s), max(s), count(*) filter (s is null) from (select ingest_id, "
        "try_cast(json_extract(extra, '$.stamp_s') as double) as s from iterations "
        "where run_id = $run and ingest_id = any($ids)) group by ingest_id order by 2, 3",
        {"run": run_id, "ids": ids},
    ).fetchall()
    coarse = con.execute(
        "select count(distinct ingest_id) from run_records where run_id = $run and ingest_id = any($ids) "
        "and coalesce(try_cast(json_extract(meta, '$.timestamps_reconstructed') as boolean), false)",
        {"run": run_id, "ids": ids},
    ).fetchone()[0]
    if len(spans) != len(ids) or any(r[3] for r in spans) or coarse != len(ids):  # every piece whole-second
        return None
    if any(b[1] < a[2] for a, b in zip(spans, spans[1:])):  # each piece starts as the one before ends
        return None
    return [r[0] for r in spans]


def _align_sources(con, run_id, refs, others, ref_clock, steps, retime_cand, solo=None) -> tuple[list, set]:
    """Align every request source of the run and infer what they lack; (reports, fields inferred).

    ``solo``: the one source that aligned when the others failed; it is aligned alone (no joint
    alignment) and may re-time the steps."""
    from .align_joint import align_joint

    report, inferred_all = [], set()
    retime_ref = retime_cand if len(others) == 1 or solo is not None else None
    # several clients of one run on one clock: aligned together, or each misses the others' load
    joint = {} if solo is not None else align_joint(con, run_id, others, ref_clock, steps, retime_cand)
    retimed = any((e.get("retime") or {}).get("retimed") for e in joint.values())
    if retimed:
        steps = _steps(con, run_id, [src[0] for src in refs])
    for ing, path, _, n_req, clock, override in others:
        clock = clock or "unix"
        if ing in joint:
            entry = joint[ing]
        else:
            own = retime_ref if solo is None or ing == solo else None
            entry = _align_source(con, run_id, ing, path, clock, ref_clock, steps, override, own)
        if (entry.get("retime") or {}).get("retimed"):
            steps = _steps(con, run_id, [s[0] for s in refs])
            retimed = True
        if entry["status"] != "failed" and len(steps.t_end):
            group = entry.get("joint_ingests") or [ing]
            coarse = None
            if steps.coarse and not retimed:
                coarse = (entry.get("retime") or {}).get("why") or _why_not_retimed(refs, others, steps)
                # said of the source, not only of the scheduling inferred for it: a client that brings its
                # own t_scheduled is as far off the steps, and explain would price the wrong steps
                entry["steps_not_retimed"] = coarse
            inf = _infer(con, run_id, ing, steps, entry, group, coarse)
            entry["inferred"] = inf
            inferred_all.update(inf.get("fields", []))
        entry.pop("joint_ingests", None)
        con.execute(
            "insert into clock_alignments values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?::json)",
            [
                run_id,
                ing,
                path,
                clock,
                ref_clock,
                entry.get("offset_s", 0.0),
                entry.get("drift", 0.0),
                entry.get("pivot_s", 0.0),
                entry["applied"],
                sorted(entry.get("inferred", {}).get("fields", [])),
                _json(entry),
            ],
        )
        report.append(entry)
    return report, inferred_all


ONLY_VLLM_RETIMED = "only a vLLM log's steps are re-timed from a client's tokens"


def _remedy(why: str) -> str:
    """What would place steps stamped to the second, given why they were not re-timed."""
    if why.startswith(ONLY_VLLM_RETIMED):
        return "give the log with sub-second stamps"
    return "give the log with sub-second stamps, or a client file with per-token times"


def _why_not_retimed(refs, others, steps: clocks.Steps) -> str:
    """Why no client re-timed whole-second steps, when no re-timing was tried."""
    if not steps.reconstructed:  # stamped to the second, and no vLLM step log (SGLang's)
        sampled = "; the log shows one decode step in several" if steps.sampled else ""
        return f"{ONLY_VLLM_RETIMED}{sampled}"
    if len(refs) > 1:
        return (
            f"the steps come from {len(refs)} files whose stamps interleave: only one log, or the pieces "
            "of one rotated log, is re-timed"
        )
    if len(others) > 1:
        return f"{len(others)} request files, each aligned on its own: only a single client's token times re-time steps"
    return "steps stamped to the second"


# A given offset under which fewer of the steps in the client's span have the decode count the
# client's requests imply is called into doubt (right offsets match 93-100% on the recordings).
GIVEN_MIN_STEPS_SHARE = 0.8
# An estimated offset is the best one there is, which says nothing of whether the files are one
# run: the steps in a client's span whose batch size its requests in flight match (within one)
# were 83-100% for every pair of the vLLM recordings (whole-second logs at 40 req/s the lowest),
# and 51% for a client of another simulated run of the same workload, joined on their shared
# burst. Below this share the join is called into doubt.
ESTIMATED_MIN_STEPS_SHARE = 0.7
# A given offset that puts this much smaller a share of first tokens on step ends than the estimated
# one is called into doubt too (a few steps off: 39-48% against 98% on the recording).
GIVEN_WORSE_SHARE = 0.2

# Two Unix clocks of one run differ by seconds at most (NTP), a log read in the wrong time zone by
# whole hours (at most 26); an estimated offset beyond this joins two runs, whatever the counts say.
MAX_UNIX_GAP_S = 2 * 86400.0

# Two request sources whose requests pair up (same prompt and output tokens, arrivals this close
# on the steps' clock) for at least this share of each are taken for two records of one set of
# requests (a client's and the server's): the run would count every request twice.
TWIN_ARRIVAL_S = 0.05
TWIN_SHARE = 0.9

_TWINS = """
with a as (select t_arrival + $sa as t_arrival, prompt_tokens, output_tokens from requests
           where run_id = $run and ingest_id = $a),
     b as (select t_arrival + $sb as t_arrival, prompt_tokens, output_tokens from requests
           where run_id = $run and ingest_id = $b)
select (select count(*) from a), (select count(*) from b),
       (select count(*) from b semi join a on a.prompt_tokens = b.prompt_tokens
          and a.output_tokens = b.output_tokens and abs(a.t_arrival - b.t_arrival) <= $tol)
"""


def _same_requests(
    con, run_id: str, a: tuple[int, str], b: tuple[int, str], shift_a: float = 0.0, shift_b: float = 0.0
) -> dict | None:
    """``{paths, matched, requests}`` when sources ``a`` and ``b`` (ingest id, path) hold the same requests
    (their arrivals compared after adding ``shift_a`` and ``shift_b``)."""
    params = {"run": run_id, "a": a[0], "b": b[0], "tol": TWIN_ARRIVAL_S, "sa": shift_a, "sb": shift_b}
    n_a, n_b, matched = con.execute(_TWINS, params).fetchone()
    if not n_a or not n_b or matched < TWIN_SHARE * max(n_a, n_b):
        return None
    return {"paths": [a[1], b[1]], "matched": int(matched), "requests": [int(n_a), int(n_b)]}


def _json(obj) -> str:
    import json

    return json.dumps(obj, default=float)


def _align_source(con, run_id, ing, path, clock, ref_clock, steps, override, retime_ref=None) -> dict:
    import numpy as np

    from . import clocks, retime

    entry: dict = {"path": path, "clock": clock}
    if override is not None:
        # the offset is known, but steps rebuilt from whole-second stamps still need the
        # client's token times to be placed within their seconds (as with an estimated offset)
        given = clocks.Alignment(True, override, 0.0, 0.0, method="--clock-offset")
        req = _requests(con, run_id, ing)
        if retime_ref is not None:
            how, _ = retime.retime(con, run_id, retime_ref, req, given, given=override)
            entry["retime"] = how | {"ingest_id": retime_ref} if how.get("retimed") else how
            if how.get("retimed"):
                steps = _steps(con, run_id, retime.ids(retime_ref))
        # how well the given offset joins the files, in the estimate's figures: a wrong one shows
        if len(req.t_first_token) and len(steps.t_end):
            q = clocks.assess(steps, req, given)
            # no step inside the client's span at this offset: none matched (a warning), not "unknown"
            share = 0.0 if q.steps_matched_share is None else q.steps_matched_share
            entry.update(steps_matched_share=share, requests_matched_share=q.requests_matched_share)
            if not steps.coarse:
                # an offset a few steps wrong still matches nearly all steps' decode counts, but no
                # longer puts first tokens on step ends: the estimate says where they land
                # (the estimate also holds the client's read lag, a ms or two after a step's end, which
                # a true clock offset does not: only a gap of half a step or more is a wrong offset)
                est = clocks.estimate(steps, req)
                gain = (est.requests_matched_share or 0.0) - (q.requests_matched_share or 0.0)
                dur = steps.t_end - steps.t_start
                half_step = 0.5 * float(np.median(dur[dur > 0])) if np.any(dur > 0) else 0.0
                apart = abs(est.offset_s - override)
                if est.ok and gain >= GIVEN_WORSE_SHARE and apart > max(half_step, 3e-3 * (est.uncertainty_ms or 0)):
                    entry["estimate_fits_better"] = {
                        "offset_s": est.offset_s,
                        "requests_matched_share": est.requests_matched_share,
                    }
        _transform(con, run_id, ing, override, 0.0, 0.0, inverse=False)
        entry.update(
            status="override", applied=True, offset_s=override, drift=0.0, pivot_s=0.0, method="--clock-offset"
        )
        # a bench file's times count from its first request; an offset measured against the raw
        # perf_counter clock is that much too small (the warning says which offset to give instead)
        origin = scalar(
            con,
            "select max(try_cast(json_extract(meta, '$.perf_counter_origin_s') as double)) from run_records "
            "where run_id = $r and ingest_id = $i",
            {"r": run_id, "i": ing},
        )
        if origin is not None:
            entry["times_from_s"] = origin
        return entry
    req = _requests(con, run_id, ing)
    al = clocks.estimate(steps, req)
    entry.update({k: v for k, v in al.to_dict().items() if k not in ("ok",)})
    days_apart = al.ok and _days_apart(clock, ref_clock, al.offset_s)
    if days_apart:
        al = replace(
            al,
            ok=False,
            reason=(
                f"both files carry Unix times, yet the best offset is {al.offset_s:+.0f} s "
                f"({abs(al.offset_s) / 86400:.1f} days): one run's machines agree within seconds, and a wrong "
                "time zone moves a log by hours, so these look like two runs; if they are one, pass "
                "--clock-offset SOURCE=SECONDS"
            ),
        )
        entry.update(reason=al.reason)
    # (two Unix clocks days apart are two runs, however well the tokens would fit: no rescue)
    if not al.ok and not days_apart and retime_ref is not None and al.drift == 0.0 and al.requests:
        # decode counts can fit several offsets equally badly (a log cut short inside a saturated run
        # holds only its flat stretch); the client's tokens matched to the steps' decode tokens, every
        # step end inside its logged second, pin the offset where the counts cannot
        how, al_rt, _ = _retime_and_assess(con, run_id, retime_ref, req, al)
        if al_rt is not None and al_rt.ok and not _days_apart(clock, ref_clock, al_rt.offset_s):
            entry.update({k: v for k, v in al_rt.to_dict().items() if k not in ("ok", "reason")})
            entry.pop("reason", None)
            entry.update(
                retime=how | {"ingest_id": retime_ref},
                estimate_failed=al.reason,
                offset_before_retime_s=al.offset_s,
                uncertainty_ms=round(how["offset_interval_ms"] / 2, 3),
            )
            _transform(con, run_id, ing, al_rt.offset_s, 0.0, al.pivot_s, inverse=False)
            entry.update(status="aligned", applied=True)
            return entry
        if al_rt is not None:
            retime.undo(con, run_id, retime_ref)
        entry["retime"] = how if al_rt is None else {"retimed": False, "why": "the re-timed steps still disagree"}
    if not al.ok:
        entry.update(status="failed", applied=False)
        return entry
    # Two unix clocks are taken to agree unless they differ by more than a step (and the
    # estimate's uncertainty): the estimate also holds the latency from a step's end to
    # the record's stamp, which is no clock error.
    dur = steps.t_end - steps.t_start
    step_s = float(np.median(dur)) if len(dur) else 0.0
    if (
        clock == ref_clock == "unix"
        and al.drift == 0.0
        and abs(al.offset_s) <= max(3e-3 * (al.uncertainty_ms or 0.0), step_s)
    ):
        entry.update(
            status="same clock",
            applied=False,
            note="both clocks are unix and agree within a step time: no offset applied",
        )
        entry["estimated_offset_s"], entry["offset_s"] = entry["offset_s"], 0.0
        return entry
    if retime_ref is not None and al.drift == 0.0:
        how, al_rt, steps_rt = _retime_and_assess(con, run_id, retime_ref, req, al)
        entry["retime"] = how | {"ingest_id": retime_ref} if how.get("retimed") else how
        if al_rt is not None:
            before, al, steps = al.offset_s, al_rt, steps_rt
            entry.update({k: v for k, v in al.to_dict().items() if k not in ("ok",)})
            # the stamps bound the offset to an interval: half its width is the uncertainty
            entry.update(offset_before_retime_s=before, uncertainty_ms=round(how["offset_interval_ms"] / 2, 3))
    if steps.coarse and not (entry.get("retime") or {}).get("retimed"):
        # steps rebuilt from whole-second stamps may sit up to a second off where they ran, so the fine
        # stage's few ms of residual against them say nothing about the offset; and an offset seconds
        # away that fits the decode counts about as well means even that is not pinned
        lo, hi = al.apply(np.array([req.t_arrival.min(), req.t_finish.max()]))
        held = int(np.sum((steps.t_end >= lo) & (steps.t_end <= hi)))
        if held < COARSE_MIN_STEPS:
            entry.update(
                status="failed",
                applied=False,
                reason=f"only {held} of the log's steps, stamped to the second, fall in the client's span: too "
                f"few to place the client on the log's clock (at least {COARSE_MIN_STEPS}, or per-token times "
                "that re-time them); pass --clock-offset SOURCE=SECONDS if you know the offset",
            )
            return entry
        unc = STAMP_RESOLUTION_S
        r = clocks.rival(steps, req, al.offset_s, STAMP_RESOLUTION_S)
        if r is not None and r[1] < clocks.MAX_RIVAL_RATIO:
            entry["offset_rival"] = {"offset_s": r[0], "disagreement_ratio": round(r[1], 3)}
            unc += abs(r[0] - al.offset_s)  # as far as the rival, which is as uncertain itself
        entry["uncertainty_ms"] = round(max(entry.get("uncertainty_ms") or 0.0, unc * 1e3), 3)
    _transform(con, run_id, ing, al.offset_s, al.drift, al.pivot_s, inverse=False)
    entry.update(status="aligned", applied=True)
    return entry


def _days_apart(clock: str, ref_clock: str, offset_s: float) -> bool:
    """Two Unix clocks this far apart are two runs (see MAX_UNIX_GAP_S)."""
    return clock == ref_clock == "unix" and abs(offset_s) > MAX_UNIX_GAP_S


def _retime_and_assess(con, run_id: str, retime_ref, req: clocks.Requests, al: clocks.Alignment):
    """Re-time the steps of ``retime_ref`` from the client's tokens (on ``al``'s span), then judge the
    new offset on the re-timed steps: (report, the alignment on them or None, the re-timed steps)."""
    from . import clocks, retime

    how, offset = retime.retime(con, run_id, retime_ref, req, al)
    if offset is None:
        return how, None, None
    steps = _steps(con, run_id, retime.ids(retime_ref))
    return how, clocks.assess(steps, req, clocks.Alignment(True, offset, 0.0, al.pivot_s, requests=al.requests)), steps


def _off_by(uncertainty_ms: float | None) -> str:
    """How far steps stamped to the second and not re-timed may sit off their requests: a second, or
    the offset's uncertainty when the decode counts do not pin it (``uncertainty_ms``, else None)."""
    return "up to a second" if uncertainty_ms is None else f"{uncertainty_ms / 1e3:.1f} s"


def _infer(
    con,
    run_id: str,
    ing: int,
    steps: clocks.Steps,
    entry: dict,
    group: list[int] | None = None,
    coarse: str | None = None,
) -> dict:
    """Fill what a request source lacks from the (now aligned) steps; returns what was inferred.

    ``group``: the sources aligned together with it (their requests share the steps' prefill)."""
    import numpy as np

    out: dict = {"fields": []}
    have = con.execute(
        "select count(t_scheduled), count(preemptions), count(*), count(prompt_tokens) from requests "
        "where run_id = ? and ingest_id = ?",
        [run_id, ing],
    ).fetchall()[0]
    if have[0] == 0 and not have[3]:
        # prefill token accounting needs each prompt's length: say why queueing stays unknown
        out["t_scheduled_not_inferred"] = "its records give no prompt token counts"
    if have[0] == 0 and not steps.sampled and np.isfinite(steps.prefill_tokens).mean() > 0.9:
        got = _infer_scheduled(con, run_id, ing, steps, group or [ing], coarse=bool(coarse))
        if got is not None:
            unc, outside = got
            if coarse:  # steps rebuilt from whole-second stamps and not re-timed: each may sit that far off
                # (or as far as the offset is uncertain, when the decode counts do not pin it)
                far = (entry.get("uncertainty_ms") or 0.0) / 1e3 if entry.get("offset_rival") else 0.0
                unc = np.maximum(unc, max(STAMP_RESOLUTION_S, far))
            out["fields"].append("t_scheduled")
            out["t_scheduled"] = {
                "method": "prefill token accounting: the step where the prompt's first chunk was computed, "
                "anchored at the step that produced the request's first token",
                "median_uncertainty_ms": round(float(np.median(unc)) * 1e3, 3),
                "p90_uncertainty_ms": round(float(np.quantile(unc, 0.9)) * 1e3, 3),
                "requests_outside_steps": outside,
            }
            if coarse:
                out["t_scheduled"]["steps_not_retimed"] = coarse
    if have[1] == 0 and not steps.sampled:
        # a source left on its clock (two Unix clocks within a step) is still a few ms off the steps:
        # its tokens are matched to steps on the estimated offset, or every gap looks like a skipped step
        shift = 0.0 if entry.get("applied") else float(entry.get("estimated_offset_s") or 0.0)
        n = _infer_preemptions(con, run_id, ing, shift)
        if n is not None:
            out["fields"].append("preemptions")
            out["preemptions"] = {
                "method": "token gaps in which the request sat out at least one step",
                "requests_preempted": n,
            }
    return out


MIN_LAG_SAMPLE = 20  # first tokens inside the steps needed to learn the client's read lag from them
STAMP_RESOLUTION_S = 1.0  # vLLM's and SGLang's default log stamps: whole seconds
# steps stamped to the second, not re-timed, that must fall in a client's span to place it at all:
# a piece of 13 steps of a saturated run was placed 4.4 s off
COARSE_MIN_STEPS = 50


def _infer_scheduled(
    con, run_id: str, ing: int, steps: clocks.Steps, group: list[int], coarse: bool = False
) -> tuple[np.ndarray, int] | None:
    """``t_scheduled`` per request of source ``ing`` (vectorised; see module doc); returns the
    uncertainty (s) of each one inferred and how many were left out (first token outside the
    steps).  The prefill accounting runs over the requests of every source in ``group``: they
    shared the steps' prefill tokens.  ``coarse``: the steps still sit where whole-second stamps
    put them (not re-timed)."""
    import numpy as np

    r = con.execute(
        "select req_id, ingest_id = $ing as own, t_arrival, t_first_token, prompt_tokens::double as p, "
        "coalesce(cached_tokens, 0)::double as c from requests where run_id = $run and ingest_id = any($g) "
        "and t_first_token is not null and prompt_tokens is not null",
        {"run": run_id, "ing": ing, "g": sorted(set(group) | {ing})},
    ).fetchnumpy()
    if len(r["req_id"]) == 0:
        return None
    pf = np.nan_to_num(steps.prefill_tokens, nan=0.0)
    cum = np.cumsum(pf)
    n = len(cum)
    a, f = _f(r["t_arrival"]), _f(r["t_first_token"])
    p = np.maximum(_f(r["p"]) - _f(r["c"]), 1.0)
    ends = steps.t_end
    # a first token outside the log's steps (a log cut short, a client that ran on) has no step
    # that produced it: its scheduling stays unknown rather than clamped to the log's edge
    # (steps rebuilt from whole-second stamps may sit up to a second off: that much is still "in";
    # once re-timed from the client's tokens they sit where the client saw them)
    slack = STAMP_RESOLUTION_S if coarse else float(np.median(ends - steps.t_start))
    inside = (f >= steps.t_start[0]) & (f <= ends[-1])
    if not coarse and inside.sum() >= MIN_LAG_SAMPLE:
        # a client reads its tokens some ms after the step that made them (more when its CPU is
        # busy): a first token read after the last step by no more than its usual lag is that step's
        prev_end = ends[np.maximum(np.searchsorted(ends, f[inside], side="right") - 1, 0)]
        slack = min(max(slack, float(np.percentile(f[inside] - prev_end, 90))), 1.0)
    known = (f >= steps.t_start[0]) & (f <= ends[-1] + slack)
    # ... nor takes a share of the log's prefill tokens from the requests it does hold
    p = np.where(known, p, 0.0)
    # the step that produced the first token: nearest end, then back to the last step with prefill in it
    k1 = np.clip(np.searchsorted(ends, f), 1, n - 1)
    k1 = np.where(np.abs(f - ends[k1 - 1]) <= np.abs(ends[k1] - f), k1 - 1, k1)
    last_pf = np.maximum.accumulate(np.where(pf > 0, np.arange(n), -1))
    k1 = np.where(last_pf[k1] >= 0, last_pf[k1], k1)
    # Requests whose prefill ends in the same step k finish it in arrival order (FCFS), the
    # last one with the step's last prefill token: request i ends at P[k] minus the prompts
    # after it in that group, and began p_i tokens before its end.  The step where the
    # running prefill sum first passes that start is where it was scheduled.
    order = np.lexsort((a, k1))
    k_s, p_s = k1[order], p[order]
    first = np.r_[True, k_s[1:] != k_s[:-1]]
    grp = np.cumsum(first) - 1
    incl = np.cumsum(p_s) - np.repeat(np.cumsum(p_s)[first] - p_s[first], np.bincount(grp))
    after = np.bincount(grp, weights=p_s)[grp] - incl
    end = np.empty_like(p)
    end[order] = cum[k_s] - after
    start = end - p
    k_arr = np.minimum(np.searchsorted(steps.t_start, a, side="left"), k1)  # not before it arrived
    k_hi = np.clip(np.searchsorted(cum, start, side="right"), k_arr, k1)
    # the earliest start the step's tokens allow (its prompt ending at the step's first prefill token)
    before = np.where(k1 > 0, cum[np.maximum(k1 - 1, 0)], 0.0)
    k_lo = np.clip(np.searchsorted(cum, np.minimum(before + 1 - p, start), side="right"), k_arr, k_hi)
    lo, hi = steps.t_start[k_lo], steps.t_start[k_hi]
    t_sched = np.clip(hi, a, f)
    own = np.asarray(r["own"], dtype=bool)
    known, t_sched, lo, hi = known[own], t_sched[own], lo[own], hi[own]
    if not known.any():
        return None
    import pyarrow as pa

    con.register(
        "_inferred",
        pa.table({"req_id": pa.array(r["req_id"][own]), "t_scheduled": pa.array(t_sched, mask=~known)}),
    )
    try:
        con.execute(
            "update requests q set t_scheduled = i.t_scheduled from _inferred i "
            "where q.run_id = $run and q.ingest_id = $ing and q.req_id = i.req_id",
            {"run": run_id, "ing": ing},
        )
    finally:
        con.unregister("_inferred")
    return (hi - lo)[known], int((~known).sum())


def _infer_preemptions(con, run_id: str, ing: int, shift_s: float = 0.0) -> int | None:
    """Preemptions per request from token gaps spanning more than one step, when tokens come one per
    step; ``shift_s`` puts the source's token times on the steps' clock for the matching only."""
    store.materialise(
        con, "ingest/preemption_gaps", {"run": run_id, "ing": ing, "shift": shift_s}, table="_gaps", temp=True
    )
    ones, total = con.execute("select sum(ones), sum(n) from _gaps").fetchone()
    if not total or ones < 0.8 * total:  # tokens arrive in chunks: one gap per step cannot be assumed
        con.execute("drop table _gaps")
        return None
    con.execute(
        "update requests q set preemptions = g.gaps from _gaps g "
        "where q.run_id = $run and q.ingest_id = $ing and q.req_id = g.req_id",
        {"run": run_id, "ing": ing},
    )
    n = scalar(con, "select count(*) from _gaps where gaps > 0")
    con.execute("drop table _gaps")
    return int(n)


def cross_clock_problem(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """Why quantities joining steps and requests cannot be computed for this run, or None."""
    meta = scalar(
        con, "select json_extract_string(meta, '$.clock_alignment.problem') from runs where run_id = ?", [run_id]
    )
    if not meta:
        return None
    return f"run {run_id}: its steps and requests are on different clocks that could not be aligned ({meta})"


def coarse_steps_problem(con: duckdb.DuckDBPyConnection, run_id: str) -> str | None:
    """Why this run's steps may sit up to a second off its requests, or None.

    Steps rebuilt from whole-second stamps that no client re-timed: the scheduling inferred on
    them is good to a second only, and so is which step a request's tokens fall in."""
    why = scalar(
        con,
        "select string_agg(distinct w, '; ') from (select coalesce(json_extract_string(s.value, "
        "'$.steps_not_retimed'), json_extract_string(s.value, '$.inferred.t_scheduled.steps_not_retimed')) as w from runs, "
        "json_each(json_extract(runs.meta, '$.clock_alignment.sources')) s where run_id = ?) where w is not null",
        [run_id],
    )
    if not why:
        return None
    far = scalar(
        con,
        "select max(json_extract(s.value, '$.uncertainty_ms')::double) from runs, "
        "json_each(json_extract(runs.meta, '$.clock_alignment.sources')) s where run_id = ? "
        "and json_extract(s.value, '$.offset_rival') is not null",
        [run_id],
    )
    pin = "" if far is None else ", and the decode counts do not pin the offset"
    return (
        f"the log's steps, stamped to the second, were NOT re-timed ({why}){pin}: they may sit {_off_by(far)} "
        "off the requests, so the queue / prefill split inferred on them and which steps delayed whom "
        f"can be wrong by that much ({_remedy(why)}: docs/incidents.md)"
    )


def describe(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[tuple[bool, str]]:
    """One line per aligned source of these runs for the ingest output: ``(is_problem, text)``."""
    import json

    rows = con.execute(
        "select run_id, meta from runs where run_id = any($r) "
        "and json_extract(meta, '$.clock_alignment') is not null order by run_id",
        {"r": sorted(set(run_ids))},
    ).fetchall()
    lines = [line for run_id, meta in rows for line in source_lines(run_id, json.loads(meta))]
    # an offset given for a file of steps: the steps are the clock the others are put on
    refs = con.execute(
        "select distinct i.path from clock_overrides o join ingests i on i.path = o.path "
        "where o.run_id = any($r) and i.ingest_id in (select ingest_id from iterations where run_id = o.run_id) "
        "order by 1",
        {"r": sorted(set(run_ids))},
    ).fetchall()
    for (path,) in refs:
        name = _file_name(path)
        lines.append(
            (
                True,
                f"--clock-offset {name}=... was not applied: {name} holds the run's steps, the clock the "
                "other files are put on; give the offset of the client's file instead",
            )
        )
    return lines


def _file_name(path) -> str:
    """A file's name inside a line of ours: quoted and escaped when it holds a line break or a
    control character (a file named "x\\nrun r: ... aligned" must not print a line of its own)."""
    from ..terminal import inline

    return inline(str(path).rsplit("/", 1)[-1])


def source_lines(run_id: str, meta: dict, doubts_only: bool = False) -> list[tuple[bool, str]]:
    """What ``meta.clock_alignment`` says, one ``(is_problem, text)`` per request source.

    ``doubts_only``: only the sources whose join itself is in doubt (a given offset the steps do
    not bear out, an offset the decode counts do not pin, a client whose requests the steps do
    not follow), not those that are joined but sit on whole-second steps: what explain repeats
    beside its own warning about those (:func:`coarse_steps_problem`)."""
    info = meta.get("clock_alignment") if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        return []
    out: list[tuple[bool, str]] = []
    ref = ", ".join(_file_name(p) for p in info.get("reference", []))
    for twin in info.get("same_requests", []):
        a, b = (_file_name(p) for p in twin["paths"])
        out.append(
            (
                True,
                f"run {run_id}: {a} and {b} look like two records of the same requests ({twin['matched']} of "
                f"{b}'s {twin['requests'][1]} have a request in {a} with the same token counts arriving within "
                f"{TWIN_ARRIVAL_S * 1e3:g} ms): the run counts each of them twice; ingest one of the two "
                "(or give them different --run-id); if they are two clients, ignore this",
            )
        )
    for src in info.get("sources", []):
        name = _file_name(src.get("path", "?"))
        if src.get("status") == "failed":
            out.append(
                (
                    True,
                    f"run {run_id}: {name} NOT aligned with {ref}: {src.get('reason')}; "
                    "tail attribution, replay and the Perfetto timeline of this run are refused "
                    "(they join steps and requests); each file's own metrics stand",
                )
            )
            continue
        poor = False
        if src.get("status") == "override":
            text = f"run {run_id}: {name} put on {ref}'s clock with --clock-offset {src['offset_s']:+.6f} s"
            share = src.get("steps_matched_share")
            if share is not None:
                text += f", matched {share:.0%} of steps"
                if src.get("requests_matched_share") is not None:
                    text += f" and {src['requests_matched_share']:.0%} of first tokens"
                poor = share < GIVEN_MIN_STEPS_SHARE
                better = src.get("estimate_fits_better")
                if better and not poor:
                    poor = True
                    text += (
                        f" (the estimated offset {better['offset_s']:+.6f} s puts {better['requests_matched_share']:.0%} "
                        "of first tokens on a step end): check the offset, or leave --clock-offset out to have it "
                        "estimated"
                    )
                if share < GIVEN_MIN_STEPS_SHARE:
                    text += (
                        " (an offset that joins the files matches nearly all steps): check the offset, or leave "
                        "--clock-offset out to have it estimated"
                    )
                    origin = src.get("times_from_s")
                    if isinstance(origin, (int, float)):
                        text += (
                            f" (its times count from its first request, perf_counter {origin:.6f} s: an offset "
                            "measured against the raw perf_counter clock is that much too small, so "
                            f"--clock-offset {name}={src['offset_s'] + origin:.6f} if that is how it was measured)"
                        )
        else:
            shares = []
            if src.get("steps_matched_share") is not None:
                shares.append(f"{src['steps_matched_share']:.0%} of steps")
            if src.get("requests_matched_share") is not None:
                shares.append(f"{src['requests_matched_share']:.0%} of first tokens")
            verb = "aligned with" if src.get("applied") else "already on the clock of"
            off = src.get("estimated_offset_s", src.get("offset_s", 0.0))
            text = (
                f"run {run_id}: {name} {verb} {ref}: offset {off:+.6f} s ± {src.get('uncertainty_ms')} ms, "
                f"matched {' and '.join(shares)}, median residual {src.get('median_residual_ms') or 0:.3f} ms"
            )
            if src.get("applied") is False:
                text += " (no offset applied)"
            if src.get("together_with"):  # the match figures are the clients' together
                text += f", together with {', '.join(str(p).rsplit('/', 1)[-1] for p in src['together_with'])}"
            if src.get("drift"):
                text += f", drift {src['drift'] * 1e6:.2f} ppm"
            share = src.get("steps_matched_share")
            if share is not None and share < ESTIMATED_MIN_STEPS_SHARE:
                # the offset is the best there is, which says nothing of whether the files are one run
                poor = True
                text += (
                    f"; but only {share:.0%} of the steps in its span match its count of requests in flight "
                    "(the files of one run match nearly all): check that they are of one run, and that no "
                    "other client's requests reached the server"
                )
            if src.get("offset_rival"):
                poor = True
                text += (
                    f"; but the decode counts fit an offset {src['offset_rival']['offset_s'] - off:+.2f} s from it "
                    "nearly as well (the batch size barely moves in this stretch), so the offset is not pinned: "
                    "pass --clock-offset SOURCE=SECONDS if you know it"
                )
        zone = src.get("time_zone_suspect")
        if zone:
            poor = True
            text += (
                f"; an offset of {zone['hours']:+g} h and a few seconds between two Unix clocks is a time zone: "
                f"the log's stamps were read in {zone['stamps_read_in']}; if that is not where it was written, "
                "ingest it again with --tz ZONE --replace"
            )
        joined_badly = poor  # so far only what puts the join itself in doubt
        rt = src.get("retime") or {}
        if rt.get("retimed"):
            text += (
                f"; steps re-timed from its token times (moved {rt['median_move_ms']:g} ms "
                f"median, {rt['max_move_ms']:g} ms at most)"
            )
            if rt.get("log_cut_at"):
                where = "before its first step" if rt["log_cut_at"] == "start" else "after its last step"
                text += (
                    f"; the log holds only part of the client's span (cut at its {rt['log_cut_at']}: "
                    f"{rt['client_tokens_outside_log']} of the client's tokens came {where}"
                )
                if rt.get("count_shift"):  # a few steps lost at its other end too
                    text += f"; each step's token moved by {rt['count_shift']:+d} for steps lost at its other end"
                text += ")"
            if src.get("estimate_failed"):
                text += "; the offset comes from the token times (the decode counts alone did not settle it)"
            if rt.get("count_mismatch_tokens"):  # lost or repeated step lines: say where the count was moved
                text += (
                    f"; the log's decode tokens differ from the client's by {rt['count_mismatch_tokens']} "
                    f"(a step line lost or repeated?): each step's token moved by {rt['count_shift']:+d}"
                )
                if "count_shift_after" in rt:
                    text += f" before step {rt['count_shift_from_step']}, by {rt['count_shift_after']:+d} from it"
        doubt = rt.get("given_offset_fits_stamps") is False
        if doubt:  # the steps were placed on the given offset all the same: the user chose it
            lo, hi = rt["stamps_allow_s"]
            text += (
                f"; but the log's stamps allow offsets {lo:+.6f} to {hi:+.6f} s only: check the offset, "
                "or leave --clock-offset out to have it estimated"
            )
        inf = src.get("inferred") or {}
        if "t_scheduled" in inf:
            text += (
                f"; scheduling inferred from steps (±{inf['t_scheduled']['median_uncertainty_ms']:g} ms "
                f"median, ±{inf['t_scheduled']['p90_uncertainty_ms']:g} ms p90)"
            )
            not_retimed = inf["t_scheduled"].get("steps_not_retimed")
            if not_retimed:
                poor = True
                text += (
                    f"; the log's steps, stamped to the second, were NOT re-timed ({not_retimed}): they may sit "
                    f"{_off_by(src['uncertainty_ms'] if src.get('offset_rival') else None)} off, and so may the inferred queue and "
                    f"prefill times ({_remedy(not_retimed)})"
                )
            outside = inf["t_scheduled"].get("requests_outside_steps") or 0
            if outside:
                text += (
                    f", not for {outside} request{'' if outside == 1 else 's'} whose first token lies outside "
                    "the log's steps (their queue and prefill times stay unknown)"
                )
        if src.get("steps_not_retimed") and "t_scheduled" not in inf:  # its own scheduling, coarse steps
            poor = True
            text += (
                f"; the log's steps, stamped to the second, were NOT re-timed ({src['steps_not_retimed']}): they "
                f"may sit {_off_by(src['uncertainty_ms'] if src.get('offset_rival') else None)} off this file's "
                f"requests, and so may which steps delayed whom in explain ({_remedy(src['steps_not_retimed'])})"
            )
        if inf.get("t_scheduled_not_inferred"):
            text += (
                f"; scheduling NOT inferred ({inf['t_scheduled_not_inferred']}): queue and prefill times stay "
                "unknown, and explain cannot split the TTFT tail"
            )
        if "preemptions" in inf:
            n = inf["preemptions"]["requests_preempted"]
            text += f"; preemptions inferred from token gaps ({n} request{'' if n == 1 else 's'})"
        if doubts_only:
            if doubt or joined_badly:
                out.append((True, text))
            continue
        out.append((doubt or poor, text))
    return out
