"""Compare two runs: deltas of the headline statistics with bootstrap confidence
intervals, a Mann-Whitney test per metric, and regression flags.

For each metric (TTFT, TPOT, ITL, E2E, queueing, iteration time) and statistic
(p50, p90, p99, p99.9, mean):

* ``delta = cand - base`` and ``rel = cand / base - 1``;
* a bootstrap CI of both, from a **block bootstrap over time** (``pipeline.blockboot``): each
  run's span is cut into blocks a few request residence times long, a replicate draws the
  run's blocks with replacement and takes every value of a drawn block (weighted percentiles
  and means, computed exactly without copying values). Requests of one run share its queue and
  batches, so resampling single requests gave intervals far too narrow: every one of 8 re-run
  pairs of one simulated load flagged some p90+ latency at 99%. Base and candidate are
  resampled independently, unless they served the same arrivals (a replay, a re-run of one
  seeded benchmark: :func:`paired_blocks`): then both are cut into the same blocks of their
  arrival time and each replicate draws the same blocks from both, so a burst both runs
  served is in or out of a replicate for both. The CI is the percentile interval of the replicate differences
  (ratios for ``rel``), expanded for the fewer runs' blocks (``blockboot.tail_level``: Student
  t on m - 1 degrees of freedom, as in batch means). A percentile with fewer than
  ``BlockRule.min_tail`` values beyond it in either run (p99.9 of under 10,000 requests) gets
  no CI and the verdict ``no verdict``;
* ``regression`` when ``rel > threshold`` and the CI of ``delta`` lies above 0;
  ``improvement`` symmetrically; ``below threshold`` when the CI excludes 0 but the change is
  no larger than the threshold; otherwise ``no significant change``.

Mann-Whitney U (scipy, two-sided, asymptotic) compares whole distributions;
``prob_cand_greater`` = U / (n_base n_cand) is the chance that a random candidate
value exceeds a random baseline one (ties count half).  Above ``MW_MAX`` values a
seeded random subsample is tested (stated in the output).  It treats values as
independent, which values of one run are not (above): read its p-values as a description,
not a gate.

Throughput (output tokens/s, requests/s) is one number per run; its CI is a normal
approximation (compound Poisson over requests for tokens/s, Poisson counts for requests/s), and
it is a regression when it *drops* by more than ``threshold`` with the CI below 0.
The steady-state rates (``steady_output_tokens_per_s``, ``steady_requests_per_s``) are
compared the same way when both runs reach a steady state: their CI is the batch-means one
of ``pipeline.metrics.STEADY`` (Student t on the fewer windows), widened by each run's edge
allowance, since the steady window was chosen from the same window rates.

The share of failed or aborted requests (``requests failed_share``) is a regression when it
rises beyond the threshold (from 0: at all) with its CI above 0; the CI is Newcombe's hybrid
score interval of a difference of two proportions (:func:`failed_share_delta`).

The default confidence is 99%: a comparison tests ~30 statistics at once, and at
95% a run against a re-run of the same workload flags one now and then.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import duckdb
import numpy as np

from . import store
from .blockboot import BLOCKS, Blocked, interval, mean_replicates, percentile_replicates, weights
from .metrics import COMPARED, SOURCES, STEADY, TIME_OF, percentile_of

METRICS = COMPARED  # from the registry (pipeline/metrics.py)
STATS = ("p50", "p90", "p99", "p999", "mean")
MW_MAX = 200_000


@dataclass(frozen=True)
class Delta:
    """One statistic of one metric, compared."""

    metric: str
    stat: str
    base: float | None
    cand: float | None
    delta: float | None
    rel: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    rel_low: float | None = None
    rel_high: float | None = None
    verdict: str = "no verdict"  # no CI: too few values beyond the percentile to judge

    @property
    def flagged(self) -> bool:
        """A regression or an improvement: a change the CI supports."""
        return self.verdict in ("regression", "improvement")


@dataclass
class Comparison:
    """Everything ``tracelat compare`` reports."""

    base_run: str
    cand_run: str
    threshold: float
    confidence: float
    resamples: int
    deltas: list[Delta] = field(default_factory=list)
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    one_sided: list[str] = field(default_factory=list)  # skipped metrics that one of the runs has
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)  # each run's bootstrap blocks
    paired: dict[str, Any] | None = None  # the shared arrivals, when blocks are drawn jointly

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.verdict == "regression"]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_run": self.base_run,
            "cand_run": self.cand_run,
            "threshold": self.threshold,
            "confidence": self.confidence,
            "bootstrap_resamples": self.resamples,
            "bootstrap_blocks": self.blocks,
            "paired": self.paired,
            "regressed": bool(self.regressions),
            "exit_code": self.exit_code,
            "deltas": [asdict(d) for d in self.deltas],
            "tests": self.tests,
            "skipped": self.skipped,
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class RunBlocks:
    """How a run is cut into time blocks for the bootstrap (``BlockRule``)."""

    t_first: float | None
    width_s: float | None
    blocks: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"blocks": self.blocks, "block_s": self.width_s, "why": self.why}


def run_blocks(con: duckdb.DuckDBPyConnection, run_id: str) -> RunBlocks:
    """The run's blocks: ``BLOCKS.blocks`` of its span and residence time (queries/compare/block_inputs.sql)."""
    rows = store.rows(con, "compare/block_inputs", {"r": run_id})
    t_first, span, residence = rows[0] if rows else (None, None, None)
    m, why = BLOCKS.blocks(span, residence)
    width = span / m if span is not None and span > 0 else None
    return RunBlocks(t_first, width, m, why)


# Two runs served the same arrivals when they hold as many requests, with the same prompt
# lengths at the same arrival rank (all but PAIR_OTHER_PROMPTS of them), arriving at the same
# offsets from their first arrival to within PAIR_SHIFT of a block (95% of them): then a
# request falls in the same block of both runs, or in the next one.
PAIR_SHIFT = 0.05
PAIR_OTHER_PROMPTS = 0.01


def _arrivals(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, dict[str, np.ndarray]]:
    """How many requests the run holds, and those with an arrival time in arrival order: each
    one's arrival (s) and prompt tokens."""
    n = con.execute("select count(*) from requests where run_id = $r", {"r": run_id}).fetchall()[0][0]
    a = con.sql(
        "select t_arrival as t, prompt_tokens as p from requests where run_id = $r and t_arrival is not null "
        "order by t_arrival, prompt_tokens nulls first",
        params={"r": run_id},
    ).fetchnumpy()
    return n, a


def paired_blocks(
    base_con: duckdb.DuckDBPyConnection,
    base_run: str,
    cand_con: duckdb.DuckDBPyConnection,
    cand_run: str,
    bb: RunBlocks,
    bc: RunBlocks,
) -> tuple[RunBlocks, RunBlocks, dict[str, Any]] | None:
    """Common blocks for two runs that served the same arrivals (``PAIR_SHIFT``), or None.

    Both runs get the fewer of their two block counts ``m``, each starting at its own first
    arrival, of one width: the longer of the two spans from first arrival to last event, over
    ``m``. A replicate then draws the same stretch of the workload from both runs. Runs of
    independent loads must not be paired: their blocks at one offset hold different requests."""
    if bb.width_s is None or bc.width_s is None:
        return None
    nb, ab = _arrivals(base_con, base_run)
    nc, ac = _arrivals(cand_con, cand_run)
    tb, tc = np.asarray(ab["t"], dtype=float), np.asarray(ac["t"], dtype=float)
    if nb != nc or len(tb) != nb or len(tc) != nc or nb < 2:
        return None
    m = min(bb.blocks, bc.blocks)
    spans = [(r.t_first + r.width_s * r.blocks) - t[0] for r, t in ((bb, tb), (bc, tc))]
    width = max(spans) / m
    if not width > 0:
        return None
    shift = float(np.percentile(np.abs((tb - tb[0]) - (tc - tc[0])), 95))
    pb, pc = np.ma.filled(ab["p"].astype(float), np.nan), np.ma.filled(ac["p"].astype(float), np.nan)
    other = float(np.mean(~((pb == pc) | (np.isnan(pb) & np.isnan(pc)))))
    if shift > PAIR_SHIFT * width or other > PAIR_OTHER_PROMPTS:
        return None
    why = f"paired: the same {nb} arrivals in both runs, {m} common blocks of {width:.3g} s"
    info = {"requests": int(nb), "arrival_shift_p95_s": shift, "blocks": m, "block_s": width}
    return RunBlocks(float(tb[0]), width, m, why), RunBlocks(float(tc[0]), width, m, why), info


def blocked_values(con: duckdb.DuckDBPyConnection, run_id: str, metric: str, rb: RunBlocks) -> Blocked:
    """A metric's values in a run, sorted, each with its time block (``TIME_OF`` its table):
    ``clamp(floor((t - t_first) / width_s), 0, m - 1)``; by position in time order (m blocks of
    equal count) when the run has no span or a value has no time. DuckDB sorts and blocks the
    values: tens of millions of token gaps are sorted once, in parallel."""
    table, where = SOURCES[metric]
    time, order = TIME_OF[table]
    rows = f"from {table} where run_id = $r and {where} and {metric} is not null"
    p: dict[str, Any] = {"r": run_id, "m": rb.blocks}
    a = None
    if rb.width_s is not None:
        a = con.sql(
            # least/greatest skip NULLs: a missing time must stay NULL to send the run to positions
            f"select {metric} as v, (case when {time} is not null "
            f"then least(greatest(floor(({time} - $t0) / $w), 0), $m - 1) end)::smallint as b "
            f"{rows} order by v",
            params={**p, "t0": rb.t_first, "w": rb.width_s},
        ).fetchnumpy()
    if a is None or np.ma.is_masked(a["b"]):
        a = con.sql(
            f"select {metric} as v, (floor((row_number() over (order by {order} nulls last) - 1) * $m "
            f"/ count(*) over ()))::smallint as b {rows} order by v",
            params=p,
        ).fetchnumpy()
    return Blocked(np.asarray(a["v"], dtype=float), np.asarray(a["b"], dtype=np.int16), rb.blocks)


def replicates(v: Blocked, w: np.ndarray, stats: tuple[str, ...] = STATS) -> dict[str, np.ndarray | None]:
    """Each stat's block-bootstrap replicates under weights ``w``; None for a percentile whose
    tail is too thin for an interval (``BlockRule.min_tail``)."""
    n = len(v.xs)
    pcts = {s: _pct(s) for s in stats if s != "mean" and not BLOCKS.tail_too_thin(n, _pct(s))}
    out: dict[str, np.ndarray | None] = {s: None for s in stats}
    out.update(zip(pcts, percentile_replicates(v, w, list(pcts.values())), strict=True))
    if "mean" in stats:
        out["mean"] = mean_replicates(v, w)
    return out


def _too_few(nb: int, nc: int) -> str:
    """Why a metric with fewer than 2 values in a run is not compared, naming the run that lacks them."""
    if nb >= 2 or nc >= 2:
        short, n, other, m = ("baseline", nb, "candidate", nc) if nb < 2 else ("candidate", nc, "baseline", nb)
        return f"the {short} has {n} value{'' if n == 1 else 's'} of it (the {other} {m}): fewer than 2 to compare"
    return f"fewer than 2 values in either run (baseline {nb}, candidate {nc})"


def _point(xs: np.ndarray, stat: str) -> float:
    return float(xs.mean()) if stat == "mean" else float(np.percentile(xs, _pct(stat)))


def _pct(stat: str) -> float:
    p = percentile_of(stat)
    assert p is not None, stat
    return p


def _verdict(rel: float | None, lo: float | None, hi: float | None, threshold: float) -> str:
    if lo is None or hi is None:
        return "no significant change"
    if rel is None:  # from a level of 0 (no queueing before): no relative size, a significant growth counts
        return "regression" if lo > 0 else "no significant change"
    if rel > threshold and lo > 0:
        return "regression"
    if rel < -threshold and hi < 0:
        return "improvement"
    return below_threshold("no significant change", lo, hi)


def below_threshold(verdict: str, lo: float | None, hi: float | None) -> str:
    """``verdict``, or "below threshold" for a change its CI supports (the CI of the difference
    excludes 0) that is no larger than the threshold: real, and smaller than the user cares about.
    Calling it "no significant change" said something false about a significant +3%."""
    if verdict == "no significant change" and lo is not None and hi is not None and (lo > 0 or hi < 0):
        return "below threshold"
    return verdict


def delta(
    metric: str,
    stat: str,
    base: np.ndarray,
    cand: np.ndarray,
    rb: np.ndarray | None,
    rc: np.ndarray | None,
    threshold: float,
    confidence: float,
    blocks: int,
) -> Delta:
    """Delta of one statistic of sorted ``base`` and ``cand``, its CI from the replicates ``rb``
    and ``rc`` (NaN where a replicate drew no value: left out) expanded for ``blocks`` (the fewer
    of the two runs', :func:`pipeline.blockboot.tail_level`), and the verdict; no CI and no verdict
    where either has no replicates."""
    pb, pc = _point(base, stat), _point(cand, stat)
    rel = pc / pb - 1 if pb > 0 else None
    ci = None if rb is None or rc is None else interval(rc - rb, confidence, blocks)
    if ci is None:
        return Delta(metric, stat, pb, pc, pc - pb, rel)
    rel_ci = None
    if pb > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_ci = interval(rc / rb - 1, confidence, blocks)
    rel_lo, rel_hi = rel_ci if rel_ci is not None else (None, None)
    lo, hi = ci
    return Delta(metric, stat, pb, pc, pc - pb, rel, lo, hi, rel_lo, rel_hi, _verdict(rel, lo, hi, threshold))


def mann_whitney(base: np.ndarray, cand: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    """Two-sided Mann-Whitney U of candidate vs baseline (subsampled above MW_MAX values)."""
    from scipy.stats import mannwhitneyu

    sub = len(base) > MW_MAX or len(cand) > MW_MAX
    b = rng.choice(base, MW_MAX, replace=False) if len(base) > MW_MAX else base
    c = rng.choice(cand, MW_MAX, replace=False) if len(cand) > MW_MAX else cand
    res = mannwhitneyu(c, b, alternative="two-sided", method="asymptotic")
    p = float(res.pvalue)
    return {
        "n_base": len(base),
        "n_cand": len(cand),
        "u": float(res.statistic),
        "p_value": p if p == p else 1.0,
        "prob_cand_greater": float(res.statistic) / (len(b) * len(c)),
        "subsampled_to": MW_MAX if sub else None,
    }


def _throughput(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, tuple[float, float | None, str] | None]:
    """``{name: (value, standard error, source)}`` of the run's throughputs.

    Output tokens/s is the ok requests' output tokens over the duration; requests arrive at
    random, so its SE is compound Poisson: ``sqrt(sum of squared request tokens) / duration``.
    A run counted from steps (no request records) has no independent units: its SE is the
    batch-means one over the span's windows (``queries/summary/steady_state.sql``,
    ``run_output_tokens_per_s_se``); None when its windows drift too much to tell.  Requests/s counts events:
    Poisson SE ``sqrt(n) / duration`` (queries/compare/throughput_inputs.sql).
    """
    rows = store.rows(con, "compare/throughput_inputs", {"r": run_id})
    if not rows or not rows[0][0]:
        return {"output_tokens_per_s": None, "requests_per_s": None}
    dur, source, n_ok, ss_req, tok_s, req_s, n_all = rows[0]
    if source == "requests":
        se = float(np.sqrt(ss_req or 0.0)) / dur
    else:  # steps are no independent units: batch means over the span's windows (pipeline/steady.py)
        from .steady import whole_run_se

        se = whole_run_se(con, run_id)
    tok = (tok_s, se, source) if tok_s is not None else None
    # a run without request records has no request rate (not a rate of 0)
    req = (req_s, float(np.sqrt(n_ok)) / dur, "requests") if req_s is not None and n_all else None
    return {"output_tokens_per_s": tok, "requests_per_s": req}


def _throughput_delta(
    name: str, b: tuple[float, float, str], c: tuple[float, float, str], threshold: float, confidence: float
) -> Delta:
    """Throughput: higher is better; normal-approximation CI of the difference."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    (vb, sb, _), (vc, sc, _) = b, c
    return _rate_delta(name, vb, vc, z * float(np.hypot(sb, sc)), threshold)


def _steady(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, tuple[float, float, float, int, str] | str]:
    """``{name: (value, se, edge, windows, source)}`` of the run's steady rates, or why there is none."""
    from .steady import section

    st = section(con, run_id)["steady_state"]
    names = ("steady_output_tokens_per_s", "steady_requests_per_s")
    if not st["reached"]:
        return {n: f"no steady state ({st['reason']})" for n in names}
    u = st["uncertainty"]
    source = "steps" if st["source"] == "iterations" else "requests"
    out: dict[str, tuple[float, float, float, int, str] | str] = {}
    for n in names:
        short = n.removeprefix("steady_")
        if st[n] is None:
            out[n] = "no ok requests" if short == "requests_per_s" else "no output tokens"
        elif u[f"{short}_se"] is None:
            out[n] = f"no interval: {u['no_interval'] or 'its window rates drift'}"
        else:
            out[n] = (float(st[n]), float(u[f"{short}_se"]), float(u[f"{short}_edge"]), int(u["windows"]), source)
    return out


def _steady_delta(
    name: str,
    b: tuple[float, float, float, int, str],
    c: tuple[float, float, float, int, str],
    threshold: float,
    confidence: float,
) -> Delta:
    """A steady rate: higher is better; batch-means CI of the difference (Student t on the fewer
    windows' degrees of freedom) widened by both runs' edge allowances (``pipeline.metrics.STEADY``)."""
    from scipy.stats import t as student_t

    (vb, sb, eb, mb, _), (vc, sc, ec, mc, _) = b, c
    q = float(student_t.ppf(0.5 + confidence / 2, min(mb, mc) - 1))
    return _rate_delta(name, vb, vc, q * float(np.hypot(sb, sc)) + eb + ec, threshold)


def _rate_delta(name: str, vb: float, vc: float, half: float, threshold: float) -> Delta:
    """A rate's delta with the half-width ``half`` of its CI: a drop beyond the threshold with the
    CI below 0 is a regression, a rise beyond it with the CI above 0 an improvement."""
    d = vc - vb
    rel = vc / vb - 1 if vb > 0 else None
    rel_half = half / vb if vb > 0 else None
    verdict = "no significant change"
    if rel is not None and rel < -threshold and d + half < 0:
        verdict = "regression"
    elif rel is not None and rel > threshold and d - half > 0:
        verdict = "improvement"
    if rel is not None:  # from 0 a rise has no relative size to set against the threshold
        verdict = below_threshold(verdict, d - half, d + half)
    return Delta(
        "throughput",
        name,
        vb,
        vc,
        d,
        rel,
        d - half,
        d + half,
        # a rate is never negative: the relative interval ends at -100% (the symmetric one went past it)
        None if rel is None else max(rel - rel_half, -1.0),
        None if rel is None else rel + rel_half,
        verdict,
    )


def compare(
    base_con: duckdb.DuckDBPyConnection,
    base_run: str,
    cand_con: duckdb.DuckDBPyConnection,
    cand_run: str,
    threshold: float = 0.05,
    confidence: float = 0.99,
    resamples: int = 2000,
    seed: int = 0,
    paired: bool = True,
) -> Comparison:
    """Compare ``cand_run`` against ``base_run`` (each in its own store, or the same one).

    ``paired``: draw both runs' blocks jointly when they served the same arrivals
    (:func:`paired_blocks`); False resamples them independently whatever they served."""
    from . import store

    store.require_run(base_con, base_run)
    store.require_run(cand_con, cand_run)
    rng = np.random.default_rng(seed)
    out = Comparison(base_run, cand_run, threshold, confidence, resamples)
    blocks_b, blocks_c = run_blocks(base_con, base_run), run_blocks(cand_con, cand_run)
    pair = paired_blocks(base_con, base_run, cand_con, cand_run, blocks_b, blocks_c) if paired else None
    if pair is not None:
        blocks_b, blocks_c, out.paired = pair
    out.blocks = {"baseline": blocks_b.to_dict(), "candidate": blocks_c.to_dict()}
    # one draw of blocks per run for every metric: a replicate is one resampled run (paired: one
    # resampled stretch of the shared workload, the same blocks from both runs)
    wb = weights(blocks_b.blocks, resamples, rng)
    wc = wb if pair is not None else weights(blocks_c.blocks, resamples, rng)
    for metric in METRICS:
        vb, vc = (
            blocked_values(base_con, base_run, metric, blocks_b),
            blocked_values(cand_con, cand_run, metric, blocks_c),
        )
        base, cand = vb.xs, vc.xs
        if len(base) < 2 or len(cand) < 2:
            out.skipped[metric] = _too_few(len(base), len(cand))
            if max(len(base), len(cand)) >= 2:
                out.one_sided.append(metric)
            continue
        rb, rc = replicates(vb, wb), replicates(vc, wc)
        fewer = min(blocks_b.blocks, blocks_c.blocks)
        for stat in STATS:
            out.deltas.append(delta(metric, stat, base, cand, rb[stat], rc[stat], threshold, confidence, fewer))
        thin = [s for s in STATS if rb[s] is None or rc[s] is None]
        if thin:
            out.skipped[f"{metric} {', '.join(thin)}"] = (
                f"no interval and no verdict: fewer than {BLOCKS.min_tail} values beyond the percentile "
                f"(baseline {len(base)}, candidate {len(cand)} values)"
            )
        out.tests[metric] = mann_whitney(base, cand, rng)
    tb, tc = _throughput(base_con, base_run), _throughput(cand_con, cand_run)
    for key in tb:
        if tb[key] is not None and tc[key] is not None and tb[key][2] != tc[key][2]:
            out.skipped[key] = f"counted from {tb[key][2]} in the baseline and from {tc[key][2]} in the candidate"
            out.one_sided.append(key)
        elif tb[key] is not None and tc[key] is not None and None in (tb[key][1], tc[key][1]):
            which = "baseline" if tb[key][1] is None else "candidate"
            out.skipped[key] = (
                f"no interval for the {which}: its steps' window rates drift (lag-1 autocorrelation > {STEADY.max_lag1})"
            )
        elif tb[key] is not None and tc[key] is not None:
            out.deltas.append(_throughput_delta(key, tb[key], tc[key], threshold, confidence))
        elif tb[key] is not None or tc[key] is not None:
            out.skipped[key] = f"only the {'baseline' if tb[key] is not None else 'candidate'} has it"
            out.one_sided.append(key)
    _compare_steady(out, _steady(base_con, base_run), _steady(cand_con, cand_run), threshold, confidence)
    fb, fc = _failures(base_con, base_run), _failures(cand_con, cand_run)
    if fb is not None and fc is not None:
        out.deltas.append(failed_share_delta(fb, fc, threshold, confidence))
    elif fb is not None or fc is not None:
        out.skipped["failed_share"] = f"only the {'baseline' if fb is not None else 'candidate'} has requests"
    _check_overlap(out)
    out.warnings.extend(setup_differences(base_con, base_run, cand_con, cand_run))
    out.warnings.extend(side_difference(base_con, base_run, cand_con, cand_run))
    return out


# A run's configuration: what the served system was, never a measured result. Two runs that
# differ in it are two setups, and a comparison across them measures every difference at once;
# nightly's ``config`` label digests the same keys. Run columns: the engine, model, GPUs and
# data types.
CONFIG_RUN_KEYS = ("engine", "model", "gpu", "num_gpus", "dtype", "kv_dtype")
# Keys of the run's ``meta``: scheduler and KV-cache settings as the ingestors record them (vLLM's
# start-up arguments and KV-cache size, TensorRT-LLM's limits, the simulator's Policy and its
# iteration-time and noise models).  Everything else in ``meta`` is left out: workload results
# (duration, token means), the benchmark's own summary, clock origins, timestamp details,
# descriptions of the input format, and workload settings (the load is not the engine's config).
CONFIG_META_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "chunked_prefill",
    "prefix_caching",
    "enable_prefix_caching",
    "admit_full_prompt",
    "scheduler_reserve_full_isl",
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "kv_block_size",
    "num_gpu_blocks",
    "kv_cache_tokens",
    "kv_capacity_tokens",
    "dp_engines",
    "iteration_model",
    "noise",
)


def _setup(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    import json

    rows = con.execute(
        f"select {', '.join(CONFIG_RUN_KEYS)}, meta from runs where run_id = $r", {"r": run_id}
    ).fetchall()
    if not rows:
        return {}
    row = rows[0]
    out = dict(zip(CONFIG_RUN_KEYS, row[:-1]))
    try:
        meta = json.loads(row[-1]) if row[-1] else {}
    except (ValueError, RecursionError):  # a run record's meta nested beyond reason: no facts from it
        meta = {}
    if isinstance(meta, dict):
        out.update((k, meta.get(k)) for k in CONFIG_META_KEYS)
    return {k: v for k, v in out.items() if v is not None and not isinstance(v, (dict, list))}


def _same(a: Any, b: Any) -> bool:
    """Whether two stated facts agree: numbers by value (256 and 256.0; bools are not numbers),
    anything else by its text, case aside (256 and "256", True and "true")."""
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return str(a).strip().lower() == str(b).strip().lower()


def setup_differences(
    base_con: duckdb.DuckDBPyConnection, base_run: str, cand_con: duckdb.DuckDBPyConnection, cand_run: str
) -> list[str]:
    """One warning naming the configuration facts (CONFIG_RUN_KEYS, CONFIG_META_KEYS; objects
    such as the simulator's models aside) both runs state and state differently; none when they
    agree or one of them does not say."""
    b, c = _setup(base_con, base_run), _setup(cand_con, cand_run)
    differ = [k for k in (*CONFIG_RUN_KEYS, *CONFIG_META_KEYS) if k in b and k in c and not _same(b[k], c[k])]
    if not differ:
        return []
    shown = "; ".join(f"{k} {str(b[k])[:80]} (baseline) vs {str(c[k])[:80]}" for k in differ)
    return [
        f"the runs are of different setups ({shown}): every change below is that of the whole setup, "
        "not of one of these alone"
    ]


def _request_side(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, list[str]] | None:
    """Where the run's request records were timed (``formats.REQUEST_SIDE``) and by which formats;
    None when a format of them is not judged or they were timed at both places."""
    from .formats import REQUEST_SIDE

    try:
        rows = con.execute(
            "select distinct g.format from requests r join ingests g using (ingest_id) where r.run_id = $r order by 1",
            {"r": run_id},
        ).fetchall()
    except duckdb.CatalogException:  # a source without the ingests table (a lake read without it)
        return None
    fmts = [f for (f,) in rows]
    sides = {REQUEST_SIDE.get(f) for f in fmts}
    if len(sides) != 1 or None in sides:
        return None
    return sides.pop(), fmts


def side_difference(
    base_con: duckdb.DuckDBPyConnection, base_run: str, cand_con: duckdb.DuckDBPyConnection, cand_run: str
) -> list[str]:
    """A warning when one run's requests were timed by the client and the other's by the server."""
    b, c = _request_side(base_con, base_run), _request_side(cand_con, cand_run)
    if b is None or c is None or b[0] == c[0]:
        return []
    return [
        f"the runs' requests were timed at different places: the baseline's by the {b[0]} "
        f"({', '.join(b[1])}), the candidate's by the {c[0]} ({', '.join(c[1])}); a client's TTFT and E2E "
        "hold the network and the HTTP server, a server's do not: latency changes below include that "
        "difference; compare runs timed alike"
    ]


def _failures(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[int, int] | None:
    """(failed or aborted requests, requests) of the run; None without request records."""
    rows = con.execute("select requests_failed, requests from run_summary where run_id = ?", [run_id]).fetchall()
    return (int(rows[0][0] or 0), int(rows[0][1])) if rows and rows[0][1] else None


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of the share k / n at normal quantile z. Its ends are exactly 0 for
    k = 0 and 1 for k = n; computed, they came out as 5.4e-20 and 0.9999999999999998."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def failed_share_delta(b: tuple[int, int], c: tuple[int, int], threshold: float, confidence: float) -> Delta:
    """The share of requests that failed or were aborted: lower is better. CI of the difference by
    Newcombe's hybrid score method (Wilson intervals of each share), which holds for shares near 0
    and a handful of failures where the normal approximation does not. A rise from 0 has no
    relative size and counts once its CI is above 0, as for latencies."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + confidence / 2))
    (kb, nb), (kc, nc) = b, c
    pb, pc = kb / nb, kc / nc
    (lb, ub), (lc, uc) = wilson(kb, nb, z), wilson(kc, nc, z)
    d = pc - pb
    lo, hi = d - math.hypot(pc - lc, ub - pb), d + math.hypot(uc - pc, pb - lb)
    rel = pc / pb - 1 if pb > 0 else None
    verdict = "no significant change"
    if lo > 0 and (rel is None or rel > threshold):
        verdict = "regression"
    elif hi < 0 and rel is not None and rel < -threshold:
        verdict = "improvement"
    verdict = below_threshold(verdict, lo, hi)
    rel_lo, rel_hi = (lo / pb, hi / pb) if pb > 0 else (None, None)
    return Delta("requests", "failed_share", pb, pc, d, rel, lo, hi, rel_lo, rel_hi, verdict)


def _compare_steady(out: Comparison, sb: dict, sc: dict, threshold: float, confidence: float) -> None:
    """The steady rates: compared when both runs have them with an interval, counted alike; else
    ``skipped`` says why. No warning: whether a short run holds its load is itself noisy, and
    the whole-run rates are compared either way."""
    for key in sb:
        b, c = sb[key], sc[key]
        if isinstance(b, tuple) and isinstance(c, tuple):
            if b[4] != c[4]:
                out.skipped[key] = f"counted from {b[4]} in the baseline and from {c[4]} in the candidate"
            else:
                out.deltas.append(_steady_delta(key, b, c, threshold, confidence))
        elif isinstance(b, str) and isinstance(c, str):
            out.skipped[key] = f"baseline: {b}; candidate: {c}" if b != c else f"neither run: {b}"
        else:
            out.skipped[key] = f"{'candidate' if isinstance(c, str) else 'baseline'}: {c if isinstance(c, str) else b}"


def _check_overlap(out: Comparison) -> None:
    """A comparison passes only on what it compared: say which statistics one run has and the
    other lacks, warn when most were not compared, and refuse when none was (no green light
    for two runs that share nothing, e.g. a server log against a client's results)."""
    from .errors import InputError

    one_sided = {m: out.skipped[m] for m in out.one_sided}
    compared = sorted({d.metric for d in out.deltas})
    if not compared:
        why = "; ".join(f"{m}: {w}" for m, w in out.skipped.items()) or "neither run has requests or steps"
        raise InputError(
            f"runs {out.base_run} and {out.cand_run} share no statistic to compare ({why}); "
            "compare runs of the same kind (both with requests, or both with steps)"
        )
    for m, why in one_sided.items():
        out.warnings.append(f"{m} not compared: {why}")
    if len(one_sided) >= len(compared):
        out.warnings.append(
            f"only {len(compared)} of {len(compared) + len(one_sided)} metrics could be compared "
            f"({', '.join(compared)}): a pass says nothing about the others"
        )
