"""From a recorded run to the simulator's inputs: workload, policy, iteration model, noise.

Decisions (docs/replay.md explains them to users):

- **Workload**: every request with an arrival time and prompt and output lengths
  >= 1, whatever its status. Failed and aborted requests took engine time in the
  recorded run (queue slots, prefill, the tokens they did generate), so they are
  replayed as load with the output length they reached; latency comparisons
  use only requests whose *recorded* status is ``ok`` (the population of the
  observed statistics). ``ok_only=True`` drops the others instead. Arrivals are
  seconds after the first replayed arrival (``t_origin_s``, kept in the replay's
  metadata). Prefix-cache hits (``cached_tokens``) go with the workload: with
  prefix caching on, each request prefills only its uncached prompt tokens.
- **Front-end delay**: when request records carry ``t_queued`` (an extra field:
  when the engine queued the request, as in vLLM's per-request stats), the time
  from arrival to engine queue (HTTP, tokenisation) does not depend on the
  scheduler, so each request reaches the simulated engine at its recorded queue
  time and its replayed ``t_arrival`` is moved back by its recorded delay: TTFT
  and E2E include the same front-end time as observed.
- **Policy**: ``runs.meta`` keys ``max_num_seqs``, ``max_num_batched_tokens``,
  ``kv_capacity_tokens`` (or vLLM's ``kv_cache_tokens``), ``chunked_prefill``
  (or ``enable_chunked_prefill``), ``kv_block_size`` (or ``block_size``) and
  ``admit_full_prompt`` (or ``scheduler_reserve_full_isl``); options given by
  the user win. A missing number is an error naming the option to pass; chunked
  prefill and whole-prompt admission default to on (vLLM v1's defaults) and the
  block size to 1 (KV counted in tokens), each with a note. A simulated run
  that predates these two settings gets what the simulator then did (tokens,
  first-chunk admission). ``prefix_caching`` (or vLLM's ``enable_prefix_caching``)
  when recorded, else on exactly when the requests report prefix-cache hits
  (some ``cached_tokens`` > 0): "as the trace says".
- **Iteration model**: the run's fit (:func:`pipeline.fit.get_or_fit`), then two
  corrections computed here from the fit's per-step table ``iteration_fit``:

  * ``mean_scale = mean(measured) / mean(predicted)`` over steps that are not
    stalls. The fit is robust (it follows the typical step), while the
    simulator's noise factor has mean 1, so the coefficients are scaled to give
    the measured mean step time; stalls are re-injected separately.
  * ``host_gap_ms``: mean of ``span_ms - iteration_ms`` (time from one step's end
    to the next step's end, minus the step itself) over steps that decode, i.e.
    while the engine is busy. The simulator runs steps back to back, so this
    host time (scheduling, detokenisation, output processing) is added to
    ``t0``. Negative means steps overlap (async scheduling) and shortens ``t0``.
    Skipped when the run's step times were reconstructed from coarse stamps.
- **Which iteration model**: the extended model (``pipeline.fit.extended``: per-request
  and prefill-attention costs, chosen by held-out error) when it predicts held-out steps
  better than the memory-bound model, else the memory-bound one (``iteration_model``, the
  ``--iteration-model`` option, can name either); ``details["iteration_model"]``
  and a note say which, with both held-out MAPEs. The extended model's ``mean_scale`` is
  computed the same way, against its own predictions.
- **Hardware what-ifs** (``whatif``: ``kv_dtype``, ``compute_speedup``): applied last, to
  the calibrated model and policy, by :mod:`.whatif` (the KV read ``a`` scales with the KV
  dtype's bytes against the recorded one, the KV capacity inversely unless given; the
  FLOP-bound terms with compute). The recorded KV dtype (``runs.kv_dtype``, else
  ``runs.dtype``, else bf16) is kept in ``details["kv_dtype"]`` so sweeps can apply them.
- **Noise** (``noise="fitted"``): log-normal sigma = the fit's robust residual
  spread, stalls at the fit's stall rate with its mean stall size.
  ``noise="none"``: no noise, no stalls (every seed gives the same replay).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb
import numpy as np

from .. import store
from ..errors import InputError
from ..terminal import inline
from ..settings import flags, settings
from ..sim import NO_NOISE, IterationModel, NoiseModel, Policy, Workload
from . import whatif as hw_whatif

# the policy's fields, their types and flags come from the Policy dataclass (declared once, in sim/config.py)
POLICY_FIELDS = tuple(f.name for f in dataclasses.fields(Policy))
BOOL_FIELDS = tuple(f.name for f, _, t in settings(Policy) if t is bool)
OPTIONS = flags(Policy)
# what a replay assumes for a field the run does not record (Policy metadata), and why
UNRECORDED = {f.name: f.metadata["unrecorded"] for f in dataclasses.fields(Policy) if "unrecorded" in f.metadata}
# runs.meta keys that may hold a policy field besides its own name (other engines' names), first match wins
META_ALIASES = {
    "kv_capacity_tokens": ("kv_cache_tokens",),
    "chunked_prefill": ("enable_chunked_prefill",),
    "kv_block_size": ("block_size",),
    "admit_full_prompt": ("scheduler_reserve_full_isl",),
    "prefix_caching": ("enable_prefix_caching",),
}
META_KEYS = {f: (f, *META_ALIASES.get(f, ())) for f in POLICY_FIELDS}
# field -> (policy source, note) when UNRECORDED fills it in; the notes come in this order
UNRECORDED_WHY = {
    "chunked_prefill": (
        "default (vLLM v1 chunks prefills)",
        "the run does not record whether prefill was chunked: replayed with chunked prefill "
        "(pass --no-chunked-prefill otherwise)",
    ),
    "admit_full_prompt": (
        "default (vLLM v1 scheduler_reserve_full_isl)",
        "the run does not record whether admission waits for KV room for the whole prompt: "
        "replayed with it, as vLLM's default scheduler_reserve_full_isl (pass "
        "--no-admit-full-prompt for an engine that checks only the first chunk)",
    ),
    "kv_block_size": (
        "default (KV counted in tokens)",
        "the run does not record its KV block size: KV is counted in tokens, which fits more "
        "requests than a paged cache when KV is tight (pass --kv-block-size N: vLLM uses 16 on GPU, "
        "128 on CPU)",
    ),
    # calibrate() turns it on when the recorded requests carry cached tokens; otherwise off, silently
    "prefix_caching": ("default (off)", None),
}
NOISE_MODES = ("fitted", "none")
PREFIX_NOTE = "prefix caching: "  # starts the notes about the recording's cached tokens
BUDGET_NOTE = "token budget: "  # starts the note about prompts longer than a step's budget


def budget_notes(notes: list[str], policy: Policy, workload: Workload) -> list[str]:
    """``notes`` with the note on prompts over the step budget as ``policy`` meets ``workload``.

    Without chunked prefill the simulator prefills such a prompt whole, alone in a step over
    the budget; vLLM never meets one: it refuses to start without chunked prefill when
    max_num_batched_tokens is below max_model_len."""
    out = [x for x in notes if not x.startswith(BUDGET_NOTE)]
    budget = policy.max_num_batched_tokens
    over = int((workload.prompt_tokens > budget).sum()) if len(workload) else 0
    if over and not policy.chunked_prefill:
        out.append(
            f"{BUDGET_NOTE}{over} of {len(workload)} prompts are longer than max_num_batched_tokens ({budget}) "
            "with chunked prefill off: each is prefilled whole, alone in a step over the budget (vLLM without "
            "chunked prefill needs max_num_batched_tokens >= max_model_len, so it never meets such a prompt)"
        )
    return out


ITERATION_MODELS = ("auto", "memory-bound", "extended")


@dataclass(frozen=True)
class Calibration:
    """Everything a replay of ``run_id`` needs, with where each part came from.

    Attributes:
        run_id: the recorded run.
        workload: requests to replay (arrivals relative to ``t_origin_s``).
        recorded_status: per workload row, its status in the recording.
        policy: the policy to replay under (recorded, with the user's overrides).
        baseline_policy: the recorded policy: ``runs.meta`` values, with fields the
            run does not record filled from the options (or defaults). What-if
            changes are counted against it.
        model: the calibrated iteration model the simulator uses.
        noise: the noise model the simulator uses.
        t_origin_s: recorded time of the first replayed arrival.
        frontend_delay_s: per workload row, recorded arrival -> engine queue (s);
            the workload's arrivals are the engine-queue times.
        details: fit coefficients, corrections, policy sources and request counts.
        notes: sentences about anything approximate or left out.
    """

    run_id: str
    workload: Workload
    recorded_status: np.ndarray
    policy: Policy
    baseline_policy: dict[str, Any]
    model: IterationModel
    noise: NoiseModel
    t_origin_s: float
    frontend_delay_s: np.ndarray
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    workload_source: str | None = None  # a workload file replayed instead of the run's own requests
    # hardware what-ifs applied to the model (pipeline.replay.whatif): setting -> what changed
    whatif: dict[str, Any] = field(default_factory=dict)

    @property
    def recorded_ok(self) -> np.ndarray:
        """Per workload row, whether it is in the comparison population (recorded status ``ok``)."""
        return self.recorded_status == "ok"

    def with_policy(self, **changes: Any) -> "Calibration":
        """The same calibration under another policy (``Policy`` validation applies)."""
        try:
            policy = replace(self.policy, **changes)
        except ValueError as exc:
            raise InputError(f"policy {changes}: {exc}") from exc
        return replace(self, policy=policy, notes=budget_notes(self.notes, policy, self.workload))

    def with_setting(self, name: str, value: Any) -> "Calibration":
        """The same calibration with one setting changed: a Policy field or a hardware what-if."""
        return (
            hw_whatif.apply(self, name, value) if name in hw_whatif.WHATIF_FIELDS else self.with_policy(**{name: value})
        )

    @property
    def is_what_if(self) -> bool:
        """Whether anything differs from the recording: policy, hardware what-ifs or workload."""
        return bool(self.policy_changes() or self.whatif or self.workload_source)

    def with_workload(self, workload: Workload, source: str) -> "Calibration":
        """The same engine (model, noise, policy) under another workload: a what-if.

        The file's arrivals are taken as engine-queue times (no front-end delay) and
        every request counts; the observed column stays the recorded run's, for scale.
        """
        n = len(workload)
        policy = self.policy
        if self.details.get("prefix_caching_option") is None:
            # "recorded" = as this trace says: its block hashes (or cached tokens) are replayed
            policy = replace(policy, prefix_caching=workload.has_hashes or workload.cached_tokens is not None)
        notes = [x for x in self.notes if not x.startswith(PREFIX_NOTE)]  # about the recording's own requests
        notes.append(
            f"workload from {inline(source)} ({n} requests) replayed with {self.run_id}'s fitted model and policy; "
            "'observed' is the recorded run, for scale"
        )
        if policy.prefix_caching and workload.has_hashes:
            notes.append(
                f"prefix cache simulated from the workload's hash_ids ({workload.hash_block_tokens} tokens "
                f"per id): an LRU of {max(policy.kv_capacity_tokens // workload.hash_block_tokens, 1)} "
                "blocks (kv_capacity_tokens / tokens per id)"
            )
        elif policy.prefix_caching and workload.cached_tokens is not None:
            notes.append("prefix caching: the workload's cached_tokens are replayed as cached")
        elif policy.prefix_caching:
            notes.append(
                "prefix caching is on but the workload has neither hash_ids nor cached_tokens: every "
                "prompt is prefilled in full"
            )
        return replace(
            self,
            policy=policy,
            workload=workload,
            recorded_status=np.full(n, "ok"),
            frontend_delay_s=np.zeros(n),
            workload_source=source,
            notes=budget_notes(notes, policy, workload),
        )

    def policy_changes(self) -> dict[str, Any]:
        """Policy fields that differ from the recorded (baseline) ones."""
        rec = self.baseline_policy
        return {f: getattr(self.policy, f) for f in POLICY_FIELDS if rec.get(f) != getattr(self.policy, f)}


def _meta(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    return store.run_meta(con, run_id)


def _as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    return None


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(str(v).replace(",", ""))
    except ValueError:
        return None
    return int(x) if math.isfinite(x) and x == int(x) else None


def recorded_policy(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Policy fields found in ``runs.meta`` (None when absent) and the key each came from."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f, keys in META_KEYS.items():
        values[f] = None
        for key in keys:
            v = (_as_bool if f in BOOL_FIELDS else _as_int)(meta.get(key))
            if v is not None:
                values[f], sources[f] = v, f"runs.meta.{key}"
                break
    return values, sources


def resolve_policy(
    run_id: str, recorded: dict[str, Any], sources: dict[str, str], overrides: dict[str, Any]
) -> tuple[Policy, dict[str, Any], dict[str, str], list[str]]:
    """The policy to replay under and the baseline (recorded) policy; errors name missing options.

    An option for a field the run records is a what-if change; an option for a
    field it does not record completes the baseline.
    """
    values, src, notes = {}, dict(sources), []
    for f in POLICY_FIELDS:
        if overrides.get(f) is not None:
            values[f] = overrides[f]
            src.setdefault(f, "option")
        else:
            values[f] = recorded[f]
    for f in [*UNRECORDED_WHY, *(f for f in UNRECORDED if f not in UNRECORDED_WHY)]:
        if values[f] is None:
            source, note = UNRECORDED_WHY.get(
                f,
                (
                    "default",
                    f"the run does not record {f}: replayed with {UNRECORDED[f]} (pass {OPTIONS[f]} otherwise)",
                ),
            )
            values[f], src[f] = UNRECORDED[f], source
            if note:
                notes.append(note)
    missing = [f for f in POLICY_FIELDS if values[f] is None]
    if missing:
        raise InputError(
            f"run {run_id!r} does not record {', '.join(missing)} in its metadata (runs.meta); "
            f"pass {' and '.join(OPTIONS[f] + ' N' for f in missing)} to say what the engine used"
        )
    baseline = {f: recorded[f] if recorded[f] is not None else values[f] for f in POLICY_FIELDS}
    try:
        return Policy(**values), baseline, src, notes
    except ValueError as exc:
        raise InputError(f"policy for the replay of {run_id!r} is not valid: {exc}") from exc


def load_workload(
    con: duckdb.DuckDBPyConnection, run_id: str, ok_only: bool = False
) -> tuple[Workload, np.ndarray, float, dict[str, int], list[str]]:
    """Replayable requests of a run: workload, recorded-ok mask, time origin, counts, notes."""
    df = con.sql(
        """
        with r as (
            select req_id, t_arrival, prompt_tokens, output_tokens, coalesce(status, 'ok') as status,
                   coalesce(status, 'ok') = 'ok' as recorded_ok,
                   coalesce(cached_tokens, 0) as cached_tokens,
                   greatest(coalesce(try_cast(extra->>'t_queued' as double) - t_arrival, 0), 0) as frontend_delay_s
            from requests where run_id = $run_id
        ),
        -- a request that failed or was aborted generated the tokens it received, which may be fewer
        -- than its output_tokens (a client or simulator may record the length it asked for)
        reached as (
            select req_id, len(t_s) as n_times from token_lists
            where run_id = $run_id and req_id in (select req_id from r where not recorded_ok)
        )
        select r.* replace (least(r.output_tokens, coalesce(reached.n_times, r.output_tokens)) as output_tokens),
               r.output_tokens as output_tokens_recorded
        from r left join reached using (req_id)
        order by t_arrival, req_id
        """,
        params={"run_id": run_id},
    ).pl()
    import polars as pl

    reason = (
        pl.when(pl.col("t_arrival").is_null())
        .then(pl.lit("no arrival time"))
        .when(pl.col("prompt_tokens").fill_null(0) < 1)
        .then(pl.lit("no prompt length"))
        .when(pl.col("output_tokens").fill_null(0) < 1)
        .then(pl.lit("no output tokens"))
        .when(pl.lit(ok_only) & ~pl.col("recorded_ok"))
        .then(pl.lit("not ok (--ok-only)"))
    )
    df = df.with_columns(reason=reason)
    dropped = df.filter(pl.col("reason").is_not_null()).group_by("reason").len().sort("reason")
    keep = df.filter(pl.col("reason").is_null())
    counts = {
        "recorded": df.height,
        "replayed": keep.height,
        "replayed_not_ok": int((~keep["recorded_ok"]).sum()),
        **{
            f"dropped_{r.replace(' ', '_').replace('(', '').replace(')', '').replace('-', '')}": n
            for r, n in dropped.iter_rows()
        },
    }
    notes = [f"{n} of {df.height} requests not replayed: {r}" for r, n in dropped.iter_rows()]
    if ok_only and bool(df["recorded_ok"].all()):
        notes.append(f"--ok-only: every request of {run_id!r} is ok, so none was dropped for its status")
    cut = keep.filter(pl.col("output_tokens") < pl.col("output_tokens_recorded"))
    if cut.height:
        notes.append(
            f"{cut.height} failed or aborted requests received fewer tokens than their output_tokens "
            f"({int(cut['output_tokens'].sum())} of {int(cut['output_tokens_recorded'].sum())}): "
            "replayed with the tokens they received"
        )
    if counts["replayed_not_ok"]:
        notes.append(
            f"{counts['replayed_not_ok']} replayed requests failed or were aborted in the recording: "
            "replayed as load with the output length they reached, left out of the comparison"
        )
    if keep.height == 0:
        raise InputError(
            f"run {run_id!r} has no request with an arrival time and prompt and output lengths; "
            "replay needs request records (ingest the run's per-request log or benchmark results)"
        )
    origin = float(keep["t_arrival"].min())
    # the simulated engine sees each request when it was queued; sort by that time
    keep = keep.with_columns(t_engine=pl.col("t_arrival") - origin + pl.col("frontend_delay_s")).sort(
        "t_engine", maintain_order=True
    )
    delay = keep["frontend_delay_s"].to_numpy()
    if delay.any():
        notes.append(
            f"front-end delay (arrival -> engine queue, from t_queued) kept per request: median "
            f"{np.median(delay) * 1000:.3g} ms, max {delay.max() * 1000:.3g} ms"
        )
    w = Workload(
        keep["t_engine"].to_numpy(),
        keep["prompt_tokens"].to_numpy(),
        keep["output_tokens"].to_numpy(),
        keep["req_id"].to_numpy(),
        cached_tokens=keep["cached_tokens"].clip(0).to_numpy(),
    )
    return w, keep["status"].to_numpy().astype(str), origin, delay, counts, notes


def _steps_retimed(meta: dict[str, Any]) -> bool:
    """Whether a client's token times re-timed the run's steps (pipeline.ingest.retime): their gaps are then known."""
    info = meta.get("clock_alignment")
    sources = info.get("sources") if isinstance(info, dict) else None
    return any(isinstance(x, dict) and (x.get("retime") or {}).get("retimed") for x in sources or [])


def _coarse_or_sampled(meta: dict[str, Any]) -> bool:
    """Whether the steps' stamps are whole seconds or the log samples its steps (run meta)."""
    res = meta.get("timestamp_resolution_s")
    return (isinstance(res, (int, float)) and res >= 0.5) or meta.get("decode_lines_sampled") is True


def corrections(con: duckdb.DuckDBPyConnection, run_id: str, meta: dict[str, Any]) -> tuple[float, float, list[str]]:
    """``mean_scale`` and ``host_gap_ms`` (see the module docstring), with notes."""
    rows = store.rows(con, "replay/corrections", {"run_id": run_id})
    scale, gap, busy = rows[0] if rows else (None, None, 0)
    notes = []
    if scale is None or not math.isfinite(scale) or scale <= 0:
        scale = 1.0
    retimed = _steps_retimed(meta)
    # steps stamped to the second (rebuilt from such stamps, or ending on them as SGLang's do) or only
    # some of them logged (SGLang's one decode line in 40): the gaps between them are no host time
    coarse = bool(meta.get("timestamps_reconstructed")) or _coarse_or_sampled(meta)
    if coarse and not retimed:
        gap = 0.0
        notes.append(
            "step times come from coarse log stamps (or the log shows only some steps): host time between "
            "steps is not known and not added"
        )
    elif gap is None or busy < 10:
        gap = 0.0
    else:
        # steps that touch or overlap by rounding (a re-timed log whose steps abut: -2.3e-05 ms) add no time
        gap = 0.0 if gap < 1e-3 else gap
        if meta.get("timestamps_reconstructed"):
            notes.append(
                f"step times were rebuilt from coarse log stamps and re-timed from the client's token times: "
                f"host time between steps ({gap:.3g} ms a step) is taken from them"
            )
    return float(scale), float(gap), notes


def calibrate(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    overrides: dict[str, Any] | None = None,
    noise: str = "fitted",
    ok_only: bool = False,
    whatif: dict[str, Any] | None = None,
    recorded_kv_dtype: str | None = None,
    iteration_model: str = "auto",
) -> Calibration:
    """Calibrate a replay of ``run_id`` (the store's derived tables must be current).

    ``whatif``: hardware what-ifs to apply (``kv_dtype``, ``compute_speedup``; None: not
    given), see :mod:`.whatif`; ``recorded_kv_dtype`` names the run's KV dtype for them.
    ``iteration_model``: ``auto`` (the extended model when it predicts held-out steps
    better), ``memory-bound`` or ``extended``.
    """
    from ..fit import get_or_fit

    if noise not in NOISE_MODES:
        raise InputError(f"--noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
    if iteration_model not in ITERATION_MODELS:
        raise InputError(f"--iteration-model must be one of {', '.join(ITERATION_MODELS)}, got {iteration_model!r}")
    store.require_run(con, run_id)
    from ..ingest.align import cross_clock_problem

    problem = cross_clock_problem(con, run_id)
    if problem:
        raise InputError(
            f"{problem}; replay needs the requests' arrivals on the steps' clock: pass "
            "--clock-offset SOURCE=SECONDS at ingest, or check that the files belong to one run"
        )
    steps = store.scalar(
        con,
        "select count(*) from iterations where run_id = ? and coalesce(dur_ms, (t_end - t_start) * 1000) > 0",
        [run_id],
    )
    if not steps:  # before the scheduler settings: no setting makes a model out of no steps
        raise InputError(
            f"run {run_id!r} has no steps with a duration: replay fits iteration time to the server's per-step "
            "records; ingest the server's log (vLLM --enable-logging-iteration-details, SGLang, TensorRT-LLM "
            "iteration log) with the client's records under one --run-id"
        )
    meta = _meta(con, run_id)
    rec, sources = recorded_policy(meta)
    if meta.get("simulated") is True:  # traces simulated before these settings existed: what the simulator did
        for f, v in (("kv_block_size", 1), ("admit_full_prompt", False)):
            if rec[f] is None:
                rec[f], sources[f] = v, "simulator default (runs.meta.simulated)"
    w, statuses, origin, delay, counts, wnotes = load_workload(con, run_id, ok_only)
    cached_total = int(w.cached_tokens.sum())
    if rec["prefix_caching"] is None:  # as the trace says: its requests report prefix-cache hits or not
        rec["prefix_caching"] = cached_total > 0
        sources["prefix_caching"] = "requests' cached_tokens" if cached_total else "no request reports cached_tokens"
    policy, baseline, sources, notes = resolve_policy(run_id, rec, sources, overrides or {})
    # the replay's workload and its comparison rest on the join of the run's files, as explain's shares do
    from ..ingest.align import coarse_steps_problem, source_lines

    notes += [f"ingest warned: {text}" for _, text in source_lines(run_id, meta, doubts_only=True)]
    coarse = coarse_steps_problem(con, run_id)  # steps a second off their requests: the observed TTFT split too
    if coarse:
        notes.append(f"ingest warned: {coarse}")
    if cached_total:
        share = cached_total / max(int(w.prompt_tokens.sum()), 1)
        notes.append(
            f"{PREFIX_NOTE}{cached_total} prompt tokens ({share:.1%}) were prefix-cache hits in the recording: "
            + (
                "replayed as cached, not recomputed"
                if policy.prefix_caching
                else "replayed with prefix caching off, every prompt prefilled in full"
            )
        )
    elif policy.prefix_caching:
        notes.append(
            f"{PREFIX_NOTE}on, but no request of the run reports cached_tokens: every prompt is prefilled in full"
        )
    fit = get_or_fit(con, run_id)
    if fit.t0_ms is None:
        why = "; ".join(fit.statements) or "no steps to fit"
        raise InputError(
            f"run {run_id!r} has no fitted iteration model ({why}); replay needs the run's "
            "per-step records (iteration_ms, context/prefill tokens)"
        )
    scale, gap, cnotes = corrections(con, run_id, meta)
    base = fit.iteration_model()
    ext = fit.extended
    which = "memory-bound"
    if iteration_model == "extended" and not ext:
        raise InputError(
            f"run {run_id!r} has no extended fit (too few steps, or no per-request counts): "
            "replay it with --iteration-model auto or memory-bound"
        )
    if ext and (iteration_model == "extended" or (iteration_model == "auto" and ext.get("better"))):
        # the extended model predicts held-out steps better: simulate with it, scaled to its own mean
        base, scale, which = fit.extended_model(), float(ext.get("mean_scale") or 1.0), "extended"
    t0 = max(base.t0_ms * scale + gap, 0.0)
    model = IterationModel(
        t0_ms=t0,
        a_ms_per_ctx=base.a_ms_per_ctx * scale,
        b_ms_per_prefill=base.b_ms_per_prefill * scale,
        c_ms_per_decode=base.c_ms_per_decode * scale,
        d_ms_per_req=base.d_ms_per_req * scale,
        e_ms_per_prefill_attn=base.e_ms_per_prefill_attn * scale,
    )
    if ext:
        mb, xt = ext["cv"]["memory_bound"], ext["cv"]["extended"]
        cnotes.append(
            f"iteration model: {which}{'' if iteration_model == 'auto' else ' (--iteration-model)'} (held-out MAPE {xt['mape_pct']:.3g}% extended, {mb['mape_pct']:.3g}% "
            f"memory-bound"
            + (
                f"; extended terms {', '.join(t for t in ext['terms'] if t not in fit.terms)}"
                if which == "extended"
                else ""
            )
            + ")"
        )
        if which == "extended" and ext.get("prefill_attn_source", "") and "approximated" in ext["prefill_attn_source"]:
            cnotes.append(
                "the prefill-attention cost was fitted on an approximation (chunks attending over themselves); "
                "the simulator prices each chunk's attention over its prompt's earlier chunks too"
            )
    nz = fit.noise_model() if noise == "fitted" else NO_NOISE
    details = {
        "fit": {
            "t0_ms": fit.t0_ms,
            "a_ms_per_ctx": fit.a_ms_per_ctx,
            # the 95% interval of a (memory-bound fit; None when not computed): the --kv-dtype what-if
            # warns when it includes 0
            "a_ci_ms_per_ctx": _interval(fit.ci.get("a_ms_per_ctx")),
            "b_ms_per_prefill": fit.b_ms_per_prefill,
            "c_ms_per_decode": fit.c_ms_per_decode,
            "terms": list(fit.terms),
            "r2": fit.r2,
            "mape_pct": fit.mape_pct,
            "residual_log_sigma": fit.residual_log_sigma,
            "stall_rate": fit.stall_rate,
            "stall_ms_mean": fit.stall_ms.get("mean"),
        },
        "mean_scale": scale,
        "iteration_model": which,
        "iteration_model_option": iteration_model,
        "extended": (
            {"terms": ext["terms"], "coef": ext["coef"], "cv": ext["cv"], "better": ext["better"]} if ext else None
        ),
        "host_gap_ms": gap,
        "policy_sources": sources,
        "requests": counts,
        "noise_mode": noise,
        "ok_only": ok_only,
        "prefix_caching_option": (overrides or {}).get("prefix_caching"),
        # a given capacity is the user's, so a --kv-dtype what-if does not rescale it
        "kv_capacity_option": (overrides or {}).get("kv_capacity_tokens"),
        "kv_dtype": dict(
            zip(("recorded", "source"), hw_whatif.recorded_kv_dtype(*_dtypes(con, run_id), recorded_kv_dtype))
        ),
    }
    negative = [
        f"{n} = {getattr(base, n):.3g} ms"
        for n in ("a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode")
        if getattr(base, n) < 0
    ]
    if negative:
        notes.append(
            f"fitted {', '.join(negative)} per token is below 0 (a term the data barely separate): "
            "what-ifs far outside the recorded batch sizes extrapolate it"
        )
    unfitted = [n for n in ("a_ms_per_ctx", "b_ms_per_prefill", "c_ms_per_decode") if n not in fit.terms]
    if unfitted:
        notes.append(f"terms not fitted on this run count as 0 in the replay: {', '.join(unfitted)}")
    cal = Calibration(run_id, w, statuses, policy, baseline, model, nz, origin, delay, details, notes + wnotes + cnotes)
    for name, value in (whatif or {}).items():
        if value is not None:
            cal = hw_whatif.apply(cal, name, value)
    policy = cal.policy
    usable = policy.kv_usable_tokens  # whole blocks only
    if w.prompt_tokens.size and int((w.prompt_tokens + w.output_tokens - 1).max()) > usable:
        big = int((w.prompt_tokens + w.output_tokens - 1 > usable).sum())
        blocks = f" in {policy.kv_blocks} blocks of {policy.kv_block_size}" if policy.kv_block_size > 1 else ""
        scaled = " (scaled by the --kv-dtype what-if)" if "kv_dtype" in cal.whatif else ""
        raise InputError(
            f"{big} requests of run {run_id!r} need more KV tokens than kv_capacity_tokens "
            f"({policy.kv_capacity_tokens}{blocks}){scaled} holds; pass a larger --kv-capacity-tokens"
        )
    return replace(cal, notes=budget_notes(cal.notes, policy, w))


def _interval(ci: Any) -> list[float] | None:
    """A stored 95% interval as ``[lo, hi]``; None when absent or not finite."""
    if ci is None or len(ci) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in ci):
        return None
    return [float(ci[0]), float(ci[1])]


def _dtypes(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str | None, str | None]:
    """``runs.kv_dtype`` and ``runs.dtype`` of the run."""
    rows = con.execute("select kv_dtype, dtype from runs where run_id = ?", [run_id]).fetchall()
    return rows[0] if rows else (None, None)
