"""Replay a run over several seeds and compare with what was observed (docs/replay.md).

With the recorded policy this is the model's validation: how well do the fitted
iteration model, its noise and the scheduler explain the run's TTFT, TPOT, ITL
and throughput? With a changed policy the same table shows the what-if effect.

Relative error of a statistic = ``(mean over seeds of the replay's value - observed)
/ observed``; the per-seed minimum and maximum show the seeds' spread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from ..metrics import BY_NAME, COMPARED, LATENCY
from ..sim import SimResult, simulate
from ..terminal import inline
from .calibrate import Calibration
from .stats import replay_stats

COMPARED_METRICS = LATENCY  # what a client sees: TTFT, TPOT, ITL, E2E
COMPARED_STATS = ("p50", "p90", "p99")
THROUGHPUT = ("output_tokens_per_s", "requests_per_s")
GOODPUT_STATS = ("attainment", "request_goodput_rps", "token_goodput_tps")
# the calibration report (validation replays): what-ifs move these, so their fidelity is what matters
CALIBRATION_METRICS = tuple(m for m in COMPARED if BY_NAME[m].kind != "step")  # TTFT, TPOT, ITL, E2E, queueing
CALIBRATION_STATS = ("mean", "p50", "p90", "p99")
TRUST_TOL = 0.10  # a statistic replayed within 10% of the observed one is trusted for what-ifs

# called after each seed with (seed, SimResult, stats); the CLI writes traces from it
OnResult = Callable[[int, SimResult, dict[str, Any]], None]


def replay_once(
    cal: Calibration, seed: int, extra_quantiles: dict[str, float] | None = None
) -> tuple[SimResult, dict[str, Any]]:
    """Simulate one seed of the replay and compute its statistics."""
    result = simulate(cal.workload, policy=cal.policy, model=cal.model, noise=cal.noise, seed=seed)
    if cal.frontend_delay_s.any():  # back to the client's arrival: TTFT includes the recorded front-end time
        n = result.n_requests
        result.requests["t_arrival"] = result.requests["t_arrival"] - cal.frontend_delay_s[:n]
    stats = replay_stats(result, cal.recorded_ok, extra_quantiles)
    if "prefix_cache" in result.info:  # how much of the prompts the replay took from the cache
        rq = result.requests
        stats["prefix_cache"] = {
            **result.info["prefix_cache"],
            "cached_tokens": int(rq["cached_tokens"].sum()),
            "prompt_tokens": int(rq["prompt_tokens"].sum()),
        }
    return result, stats


def unbound_max_num_seqs(cal: Calibration, most_running: int, waited_share: float | None = None) -> str | None:
    """A note when a --max-num-seqs what-if changed nothing: no step of the replays ran as many
    requests as the smaller of the recorded and the new limit, so neither ever bound and the
    what-if is the recorded policy's replay. What held the batch: the load itself when no request
    ever waited (``waited_share``, the replays' share of steps with a request waiting, is 0),
    else the KV cache or the token budget."""
    new = cal.policy_changes().get("max_num_seqs")
    old = cal.baseline_policy.get("max_num_seqs")
    if new is None or old is None or not most_running or most_running >= min(new, old):
        return None
    if waited_share == 0:
        held = "no request ever waited for a place, so the load itself (its arrivals) held the batch"
    else:
        waited = "" if waited_share is None else f" (requests waited in {waited_share:.1%} of the steps)"
        held = f"the KV cache or the token budget held the batch{waited}"
    return (
        f"max_num_seqs never bound: at most {most_running} requests ran in a step, below both the "
        f"recorded {old} and the what-if {new}; {held}, so this setting alone changes nothing here"
    )


def replay_seeds(
    cal: Calibration,
    seeds: list[int],
    on_result: OnResult | None = None,
    extra_quantiles: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Statistics of one replay per seed; results are dropped after ``on_result`` (memory)."""
    out = []
    for seed in seeds:
        result, stats = replay_once(cal, seed, extra_quantiles)
        if on_result is not None:
            on_result(seed, result, stats)
        out.append(stats)
    return out


def observed_stats(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The recorded run's statistics from the store (derived tables must be current)."""
    from ..metrics import metric_stats, run_info

    stats = metric_stats(con, run_id)
    info = run_info(con, run_id)
    stats["throughput"] = {k: info.get(k) for k in THROUGHPUT} | {"duration_s": info.get("duration_s")}
    return stats


def _rel(value: float | None, ref: float | None) -> float | None:
    if value is None or ref is None or not np.isfinite(value) or not ref:
        return None
    return (value - ref) / ref


@dataclass
class Comparison:
    """Observed vs replayed statistics of one run under one policy."""

    calibration: Calibration
    seeds: list[int]
    observed: dict[str, Any]
    replays: list[dict[str, Any]]
    run_ids: list[str] = field(default_factory=list)
    kept: bool = False  # the replays were written (--out) or ingested (--ingest) under run_ids
    # with an SLO file's [goodput]: the recorded run's goodput over the same population as
    # the replays' (requests recorded ok), and each replay's under "goodput"
    goodput_observed: dict[str, Any] | None = None
    # a what-if's replays at the recorded policy and workload (same seeds): the change is counted
    # against them, so the model's own error (the validation's) cancels out of it
    as_recorded: list[dict[str, Any]] | None = None
    as_recorded_verdict: str | None = None

    @property
    def mode(self) -> str:
        cal = self.calibration
        return "what-if" if cal.is_what_if else "validation"

    def _row(self, section: str, stat: str) -> dict[str, Any]:
        observed = self.observed if section != "goodput" else {"goodput": self.goodput_observed}
        obs = (observed.get(section) or {}).get(stat)
        vals = np.array([r[section][stat] for r in self.replays], dtype=float)
        fin = vals[np.isfinite(vals)]
        mean = float(fin.mean()) if len(fin) else None
        errs = [e for e in (_rel(float(v), obs) for v in fin) if e is not None]
        extra: dict[str, Any] = {}
        if self.as_recorded is not None and section != "goodput":
            base = np.array([r[section][stat] for r in self.as_recorded], dtype=float)
            fb = base[np.isfinite(base)]
            ref = float(fb.mean()) if len(fb) else None
            paired = [e for e in (_rel(float(v), float(b)) for v, b in zip(vals, base)) if e is not None]
            extra = {
                "as_recorded": ref,
                "rel_change": _rel(mean, ref),
                "rel_change_min": min(paired) if paired else None,
                "rel_change_max": max(paired) if paired else None,
            }
        return {
            "metric": section,
            "stat": stat,
            "observed": obs,
            "replay": mean,
            "replay_min": float(fin.min()) if len(fin) else None,
            "replay_max": float(fin.max()) if len(fin) else None,
            "rel_error": _rel(mean, obs),
            "rel_error_min": min(errs) if errs else None,
            "rel_error_max": max(errs) if errs else None,
            **extra,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One row per compared statistic (TTFT/TPOT/ITL/E2E p50/p90/p99, then throughput)."""
        rows = [self._row(m, s) for m in COMPARED_METRICS for s in COMPARED_STATS]
        return rows + [self._row("throughput", t) for t in THROUGHPUT]

    def calibration_report(self) -> dict[str, Any]:
        """Fidelity of the replay under the recorded policy, for deciding what its what-ifs can answer.

        Per metric (TTFT, TPOT, ITL, E2E, queueing) and statistic (mean, p50, p90, p99): observed,
        replayed (mean over seeds), relative error, its spread over seeds (min, max) and the bias:
        ``over`` / ``under`` when every seed errs the same way (a systematic error of the model),
        ``mixed`` when the seeds straddle the observed value (the error is within the replay's
        own randomness). A metric is trusted when every statistic is within 10%; the verdict
        names the trusted metrics, those that are not (with the worst statistic) and those the
        recording does not have.
        """
        rows = []
        for m in CALIBRATION_METRICS:
            for st in CALIBRATION_STATS:
                r = self._row(m, st)
                lo, hi = r["rel_error_min"], r["rel_error_max"]
                # one seed is "every seed" trivially: a bias needs two seeds at least to mean anything
                one = len(self.seeds) < 2
                r["bias"] = None if lo is None or one else "over" if lo > 0 else "under" if hi < 0 else "mixed"
                r["within_tol"] = None if r["rel_error"] is None else abs(r["rel_error"]) <= TRUST_TOL
                rows.append(r)
        trusted, not_trusted, missing = [], [], []
        for m in CALIBRATION_METRICS:
            mine = [r for r in rows if r["metric"] == m and r["within_tol"] is not None]
            if not mine:
                missing.append(m)
            elif all(r["within_tol"] for r in mine):
                trusted.append(m)
            else:
                worst = max(mine, key=lambda r: abs(r["rel_error"]))
                not_trusted.append(
                    {"metric": m, "stat": worst["stat"], "rel_error": worst["rel_error"], "bias": worst["bias"]}
                )
        name = lambda m: m.removesuffix("_ms")  # noqa: E731
        verdict = f"trustworthy for what-ifs (mean, p50, p90, p99 within {TRUST_TOL:.0%}): " + (
            ", ".join(name(m) for m in trusted) or "none"
        )
        if not_trusted:
            verdict += "; not: " + ", ".join(
                f"{name(x['metric'])} ({x['stat']} {x['rel_error'] * 100:+.0f}%"
                + (f", every seed {x['bias']}" if x["bias"] in ("over", "under") else "")
                + ")"
                for x in not_trusted
            )
        if missing:
            verdict += "; not in the recording: " + ", ".join(name(m) for m in missing)
        from .per_request import summarise

        per_request = summarise([r["per_request"] for r in self.replays if "per_request" in r])
        goodput = None
        if self.goodput_observed is not None and all("goodput" in r for r in self.replays):
            goodput = [self._row("goodput", st) for st in GOODPUT_STATS]
            for r in goodput:
                r["within_tol"] = None if r["rel_error"] is None else abs(r["rel_error"]) <= TRUST_TOL
        return {
            "tolerance": TRUST_TOL,
            "rows": rows,
            "trusted": trusted,
            "not_trusted": not_trusted,
            "not_observed": missing,
            "verdict": verdict,
            "per_request": per_request,
            "goodput": goodput,
        }

    def to_dict(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "run_id": cal.run_id,
            "mode": self.mode,
            "seeds": self.seeds,
            "policy": cal.policy.to_dict(),
            "recorded_policy": cal.baseline_policy,
            "changed": cal.policy_changes(),
            "what_if": cal.whatif,
            "workload": cal.workload_source,
            "model": cal.model.to_dict(),
            "noise": cal.noise.to_dict(),
            "calibration": cal.details,
            "replay_run_ids": self.run_ids,
            "prefix_cache": [r.get("prefix_cache") for r in self.replays] if cal.policy.prefix_caching else None,
            "rows": self.rows(),
            "calibration_report": self.calibration_report() if self.mode == "validation" else None,
            "as_recorded_verdict": self.as_recorded_verdict,
            "notes": cal.notes,
        }

    def _prefix_line(self) -> list[str]:
        pcs = [r["prefix_cache"] for r in self.replays if r.get("prefix_cache")]
        if not pcs:
            return []
        share = [p["cached_tokens"] / p["prompt_tokens"] for p in pcs if p["prompt_tokens"]]
        src = pcs[0]["source"]
        return [
            f"prefix: {np.mean(share) * 100:.1f}% of prompt tokens cached in the replay (from {src}"
            + (
                f", {pcs[0]['capacity_blocks']} blocks of {pcs[0]['block_tokens']} tokens, LRU"
                if "capacity_blocks" in pcs[0]
                else ""
            )
            + ")"
        ]

    def format(self) -> str:
        """A human table, one line per statistic."""
        cal = self.calibration
        m = cal.model
        head = "replayed" if self.mode == "validation" else "what-if"
        # against the recorded run a what-if is a change it predicts, not an error of the model
        diff = "error" if self.mode == "validation" else "change"
        changes = {**{k: w[k] for k, w in cal.whatif.items()}, **cal.policy_changes()}
        change = ", ".join(f"{k}={v}" for k, v in changes.items()) or "recorded policy"
        if cal.workload_source:
            change += f", workload {inline(cal.workload_source)}"
        lines = [
            f"{self.mode} replay of {cal.run_id} ({change}; {len(self.seeds)} seed(s), noise {cal.details['noise_mode']})",
            f"policy: max_num_seqs={cal.policy.max_num_seqs} max_num_batched_tokens={cal.policy.max_num_batched_tokens} "
            f"kv_capacity_tokens={cal.policy.kv_capacity_tokens} kv_block_size={cal.policy.kv_block_size} "
            f"chunked_prefill={cal.policy.chunked_prefill} admit_full_prompt={cal.policy.admit_full_prompt} "
            f"prefix_caching={cal.policy.prefix_caching}",
            f"model:  t0={m.t0_ms:.4g} ms, a={m.a_ms_per_ctx * 1000:.4g} ms/1k ctx, b={m.b_ms_per_prefill * 1000:.4g} "
            f"ms/1k prefill, c={m.c_ms_per_decode * 1000:.4g} ms/1k decode"
            + (f", d={m.d_ms_per_req:.4g} ms/request" if m.d_ms_per_req else "")
            + (
                f", e={m.e_ms_per_prefill_attn * 1e6:.4g} ms/1M prefill attention pairs"
                if m.e_ms_per_prefill_attn
                else ""
            )
            + f" ({cal.details.get('iteration_model', 'memory-bound')} model, mean scale "
            f"{cal.details['mean_scale']:.3f}, host gap {cal.details['host_gap_ms']:.3g} ms)",
            *[f"what-if: {w['summary']}" for w in cal.whatif.values()],
            _noise_line(cal),
            *self._prefix_line(),
            "",
            # a space always between columns: a what-if far from the run (+402942.5%) stays readable
            f"{'metric':<24}{'observed':>11} {head:>10} {diff:>8}{'seed range':>22}",
        ]
        based = self.as_recorded is not None
        if based:  # the what-if beside the replay at the recorded policy; the change is between the two
            lines[-1] = f"{'metric':<24}{'observed':>11} {'as recorded':>11} {head:>10} {diff:>8}{'seed range':>22}"
        for r in self.rows():
            name = f"{r['metric']} {r['stat']}" if r["metric"] != "throughput" else r["stat"]
            rng = f"{_num(r['replay_min'])} .. {_num(r['replay_max'])}" if len(self.seeds) > 1 else ""
            if based:
                lines.append(
                    f"{name:<24}{_num(r['observed']):>11} {_num(r['as_recorded']):>11} {_num(r['replay']):>10} "
                    f"{_pct(r['rel_change']):>8}{rng:>22}"
                )
                continue
            lines.append(
                f"{name:<24}{_num(r['observed']):>11} {_num(r['replay']):>10} {_pct(r['rel_error']):>8}{rng:>22}"
            )
        if based:
            lines += [
                "",
                "change: the what-if against the replay at the recorded policy (as recorded, same seeds), so "
                "the model's own error cancels; observed is the run itself",
            ]
            if self.as_recorded_verdict:
                lines.append(f"the replay as recorded against the run: {self.as_recorded_verdict}")
        if self.mode == "validation":
            rep = self.calibration_report()
            lines += [
                "",
                "calibration (recorded policy): error of the mean over seeds, seed range, bias",
                f"{'metric':<10}" + "".join(f"{st:>27}" for st in CALIBRATION_STATS),
            ]
            for m in CALIBRATION_METRICS:
                cells = []
                for r in (x for x in rep["rows"] if x["metric"] == m):
                    if r["rel_error"] is None:
                        cells.append(f"{'-':>27}")
                        continue
                    cell = (
                        f"{_pct(r['rel_error'])} [{_pct(r['rel_error_min'])}..{_pct(r['rel_error_max'])}]"
                        f" {(r['bias'] or '-')[0]}"
                    )
                    cells.append(f"{cell:>27}")
                lines.append(f"{m.removesuffix('_ms'):<10}" + "".join(cells))
            lines.append(
                "  (bias: o = every seed over, u = every seed under, m = seeds straddle the observed"
                + ("; one seed shows no bias: use --seeds 3 or more)" if len(self.seeds) < 2 else ")")
            )
            from .per_request import format_line

            if (pr := format_line(rep["per_request"])) is not None:
                lines.append(pr)
            if rep["goodput"]:
                lines.append(
                    "goodput (SLO file, requests recorded ok): "
                    + ", ".join(
                        f"{r['stat']} {_num(r['observed'])} observed, {_num(r['replay'])} replayed ({_pct(r['rel_error'])})"
                        for r in rep["goodput"]
                    )
                )
            lines.append(rep["verdict"])
        if self.run_ids and self.kept:
            lines += ["", "replay runs: " + ", ".join(self.run_ids)]
        elif self.run_ids:  # names only: nothing of them is stored
            lines += ["", "replays not kept (--out FILE and --ingest keep them as " + ", ".join(self.run_ids) + ")"]
        if cal.notes:
            lines += ["", "notes:"] + [f"  - {n}" for n in cal.notes]
        return "\n".join(lines)


def _noise_line(cal: Calibration) -> str:
    """The header's noise line: only the noise and stalls the replay injects (none with --noise none)."""
    nz = cal.noise
    if cal.details.get("noise_mode") == "none":
        return "noise:  none (--noise none: the model's step time, no spread, no stalls)"
    stalls = f"stalls {nz.stall_rate:.3g}/step of {nz.stall_ms_mean:.3g} ms" if nz.stall_rate else "no stalls"
    return f"noise:  sigma={nz.sigma:.3g}, {stalls}"


def _num(v: float | None) -> str:
    if v is None or not np.isfinite(v):
        return "-"
    return f"{v:.4g}" if abs(v) < 1e3 else f"{v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def compare(
    con: duckdb.DuckDBPyConnection,
    cal: Calibration,
    seeds: list[int],
    on_result: OnResult | None = None,
    goodput_spec: Any = None,
    as_recorded: Calibration | None = None,
) -> Comparison:
    """Replay ``cal`` once per seed and set the results beside the observed run.

    A replay of the run's own requests also compares them one to one (:mod:`.per_request`).
    With ``goodput_spec`` (an SLO file's ``[goodput]``) a validation replay also sets the
    recorded run's goodput beside each replay's, both by :func:`pipeline.slo.goodput` over
    the requests recorded ok (the replays' comparison population), each over its own duration.
    ``as_recorded``: for a what-if, the calibration at the recorded policy and workload; it is
    replayed with the same seeds and the change is counted against it (:attr:`Comparison.as_recorded`).
    """
    from .per_request import observed_per_request, per_request_errors

    obs_req = observed_per_request(con, cal)
    own_requests = goodput_spec is not None and not cal.is_what_if

    most_running = []  # per seed: the most requests a step ran (decodes and prefill chunks)
    waited = [0, 0]  # over the seeds: steps with a request waiting, steps

    def hook(seed: int, result: SimResult, stats: dict[str, Any]) -> None:
        it = result.iterations
        if len(it["decode_reqs"]):
            most_running.append(int((it["decode_reqs"] + it["prefill_reqs"]).max()))
            waited[0] += int((it["waiting_reqs"] > 0).sum())
            waited[1] += len(it["waiting_reqs"])
        if obs_req is not None:
            stats["per_request"] = per_request_errors(result, cal, obs_req)
        if own_requests:
            from .sweep import replay_goodput

            stats["goodput"] = replay_goodput(result, cal.recorded_ok, goodput_spec, stats["throughput"]["duration_s"])
        if on_result is not None:
            on_result(seed, result, stats)

    observed = observed_stats(con, cal.run_id)
    out = Comparison(cal, list(seeds), observed, replay_seeds(cal, seeds, hook))
    note = unbound_max_num_seqs(cal, max(most_running, default=0), waited[0] / waited[1] if waited[1] else None)
    if note:
        cal.notes.append(note)
    if as_recorded is not None and cal.is_what_if:
        from ..errors import InputError

        try:
            out.as_recorded = replay_seeds(as_recorded, seeds)
        except InputError as exc:  # the recorded policy cannot run these requests (a KV cache too small)
            cal.notes.append(f"the change is against the run itself: the recorded policy cannot be replayed ({exc})")
            return _finish(out, con, cal, observed, own_requests, goodput_spec)
        out.as_recorded_verdict = Comparison(as_recorded, list(seeds), observed, out.as_recorded).calibration_report()[
            "verdict"
        ]
    return _finish(out, con, cal, observed, own_requests, goodput_spec)


def _finish(out: Comparison, con, cal: Calibration, observed, own_requests: bool, goodput_spec) -> Comparison:
    if own_requests:
        out.goodput_observed = observed_goodput(con, cal.run_id, goodput_spec, observed["throughput"]["duration_s"])
    return out


def observed_goodput(
    con: duckdb.DuckDBPyConnection, run_id: str, spec: Any, duration_s: float | None
) -> dict[str, Any]:
    """The recorded run's goodput over its ok requests (a replay's population), by the one implementation."""
    from ..slo import goodput

    scratch = duckdb.connect()
    try:
        ok = con.sql("select * from request_latency where run_id = ? and status = 'ok'", params=[run_id]).pl()
        scratch.register("ok_requests", ok)
        scratch.execute("create table request_latency as select * from ok_requests")
        return goodput(scratch, run_id, spec, duration_s)
    finally:
        scratch.close()
