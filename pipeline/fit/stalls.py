"""Spikes and stalls: iterations that break the memory-bound model (SPEC §7).

Rule (applied in ``queries/fit/iteration_fit.sql``; :func:`thresholds` supplies it):
with ``r = ln(measured / predicted)`` and its robust centre ``m`` (median) and
scale ``s`` (1.4826 x MAD) over the run,

- a **stall** is a step with ``r > m + k*s`` (default k = 3.5): the model with its
  prefill term does not explain it. It is labelled ``preemption`` when the step
  preempted requests, else ``unexplained`` (GC, host hiccup, noise);
- a **prefill spike** is a step that is not a stall but exceeds its *decode
  baseline* (t0 + a*context + c*decode) by the same margin (in log ratio), with prefill
  in it: the prefill cost explains the spike.

Log ratios, because step-time noise scales with the step. A stall smaller
than about k*s of its step cannot be told from noise by any rule; the stall
statistics here describe the stalls that are found, and ``detection_limit_ms``
says how small a stall can be and still be found (at the median and the p90 step).

Why k = 3.5: with log-normal step noise a normal step crosses the threshold with
probability 2.3e-4 (k = 4: 3.2e-5). On simulated runs with 2% of steps stalled
(``benchmarks/bench_stalls.py``, 10 seeds x 2 workloads) k = 3.5 finds as many
stalls as the best per-step rule that is told the truth (noise-free step times
and the stall law) on most seeds, within 1 point on the rest, with at most 2% of
the flagged steps false; k = 4 finds 0.5-2 points fewer with none false.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb

from ..defaults import STALL_K as DEFAULT_K  # defined where `tracelat fit --help` can read it cheaply


def limit_factor(log_center: float, k: float, log_scale: float | None) -> float:
    """Smallest stall found, per ms of a step's predicted time: ``exp(m) * (exp(k*s) - 1)``.

    A step is a stall when ``measured > predicted * exp(m + k*s)``; a step at the noise
    centre (``predicted * exp(m)``) crosses that only with this much extra time per ms
    predicted. Smaller stalls hide in the step's own noise. Infinite without a spread.
    """
    if log_scale is None or not math.isfinite(log_scale):
        return math.inf
    return math.exp(log_center) * math.expm1(k * log_scale)


def stats(con: duckdb.DuckDBPyConnection, run_id: str, factor: float) -> dict[str, Any]:
    """Spike counts by cause, the size distribution of stalls (residual ms) and the detection limit.

    ``factor`` is :func:`limit_factor` of the fit: the smallest stall found on a step
    is that times the step's predicted time.
    """
    row = con.execute(
        """
        select
            count(*) filter (where predicted_ms is not null) as n,
            count(*) filter (where is_spike) as spikes,
            count(*) filter (where spike_cause = 'prefill') as prefill,
            count(*) filter (where spike_cause = 'preemption') as preemption,
            count(*) filter (where spike_cause = 'unexplained') as unexplained,
            count(*) filter (where is_stall) as stalls,
            -- sums in a fixed order, so the same steps give the same bits (threads combine in any order)
            avg(residual_ms order by residual_ms) filter (where is_stall) as mean_ms,
            quantile_cont(residual_ms, 0.5) filter (where is_stall) as p50_ms,
            quantile_cont(residual_ms, 0.9) filter (where is_stall) as p90_ms,
            quantile_cont(residual_ms, 0.99) filter (where is_stall) as p99_ms,
            max(residual_ms) filter (where is_stall) as max_ms,
            sum(residual_ms order by residual_ms) filter (where is_stall) as total_ms,
            quantile_cont(predicted_ms, [0.5, 0.9]) as step_ms
        from iteration_fit
        where run_id = ?
        """,
        [run_id],
    ).fetchall()[0]
    n, spikes, prefill, preempt, unexpl, stalls, *sizes, step_ms = row
    limit = [v * factor if v is not None and math.isfinite(factor) else None for v in (step_ms or [None, None])]
    return {
        "detection_limit_ms": {"median_step": limit[0], "p90_step": limit[1]},
        "spikes": {"count": spikes, "prefill": prefill, "preemption": preempt, "unexplained": unexpl},
        "stall_rate": stalls / n if n else None,
        "stall_ms": dict(zip(("mean", "p50", "p90", "p99", "max", "total"), sizes)) | {"count": stalls},
    }


def top_spikes(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 10) -> list[dict[str, Any]]:
    """The largest spikes (time above the decode baseline), with timestamps."""
    df = con.sql(
        """
        select
            iter, t_start, t_end, t_end - min(t_end) over () + 0.0 as t_offset_s,
            iteration_ms, predicted_ms, decode_baseline_ms, prefill_ms_part, residual_ms,
            iteration_ms - decode_baseline_ms as excess_ms,
            context_tokens, prefill_tokens, preempted_reqs, spike_cause, is_spike
        from iteration_fit
        where run_id = ?
        qualify is_spike
        order by excess_ms desc, iter
        limit ?
        """,
        params=[run_id, limit],
    ).pl()
    return df.drop("is_spike").to_dicts()


def stall_iters(con: duckdb.DuckDBPyConnection, run_id: str) -> set[int]:
    """Iteration indices flagged as stalls (for checks against a simulator's truth)."""
    rows = con.execute("select iter from iteration_fit where run_id = ? and is_stall", [run_id]).fetchall()
    return {int(r[0]) for r in rows}
