-- table:   step_parts (read by pipeline/fit, which adds running sums in Polars; not stored)
-- grain:   one row per (run_id, iter) of the fitted run with an end time and a span
-- inputs:  iteration_fit, iterations, runs
-- params:  $run_id
-- purpose: every step's span split into the parts request attribution prices (docs/model-and-attribution.md, section 5):
--   base_ms = decode_baseline_ms, pf_ms = prefill_ms_part,
--   ux_ms   = residual_ms + host_gap_ms (unexplained), ua_ms = span_ms when the step has
--   no prediction (unattributed); base + pf + ux + ua = span_ms.
--   The span starts with the host gap (the engine idle since the step before ended): gux_ms is
--   that gap (clamped to 0 .. span) when it is in ux, gua_ms when it is in ua (no prediction);
--   request attribution prices an edge inside the gap as gap, one inside the step at its parts.
--   bnd_ms = cap_ms of a step neither full nor carrying a prefill: for the step in progress when
--   a request arrives it is waiting_step (the step must end first), for later steps capacity.
--   For a request waiting through the step, its explained part (base + pf) is one cause:
--   cap_ms = base + pf when the step was full (kv_usage >= 0.9, a preemption in it, or
--   running_reqs at the run's max_num_seqs) or carried no prefill (no room was given);
--   hol_ms = base + pf when it was not full and computed other requests' prompts
--   (head-of-line blocking); hol + cap = base + pf.
--   pipeline/fit/sql.py turns these into `fit_step_sums` (running sums in step order, the
--   next step's parts, and a row at -infinity) for queries/fit/request_attribution.sql.
with seats as (
    select try_cast(meta->>'max_num_seqs' as bigint) as max_num_seqs from runs where run_id = $run_id
),

steps as (
    select
        f.*,
        coalesce(i.kv_usage >= 0.9, false)
        or coalesce(f.preempted_reqs > 0, false)
        or coalesce(i.running_reqs >= (select max(max_num_seqs) from seats), false) as is_full,
        case when f.predicted_ms is null then 0 else f.decode_baseline_ms + f.prefill_ms_part end as explained_ms
    from iteration_fit as f
    left join iterations as i on i.run_id = f.run_id and i.iter = f.iter
    where f.run_id = $run_id and f.t_end is not null and f.span_ms is not null
)

select
    t_end,
    iter,
    span_ms,
    case when predicted_ms is null then 0 else decode_baseline_ms end as base_ms,
    case when predicted_ms is null then 0 else prefill_ms_part end as pf_ms,
    case when predicted_ms is null then 0 else residual_ms + host_gap_ms end as ux_ms,
    case when predicted_ms is null then span_ms else 0 end as ua_ms,
    case when not is_full and coalesce(prefill_tokens, 0) > 0 then explained_ms else 0 end as hol_ms,
    case when not is_full and coalesce(prefill_tokens, 0) > 0 then 0 else explained_ms end as cap_ms,
    -- of cap: a step that was neither full nor gave anyone a prefill; a request that arrived while it
    -- ran waited for it to end (admission is at step boundaries), not for room (waiting_step)
    case when not is_full and coalesce(prefill_tokens, 0) = 0 then explained_ms else 0 end as bnd_ms,
    -- the host gap at the start of the span, in the part that holds it: ux (or ua without a prediction)
    case when predicted_ms is null then 0 else least(greatest(coalesce(host_gap_ms, 0), 0), span_ms) end as gux_ms,
    case when predicted_ms is null then least(greatest(coalesce(host_gap_ms, 0), 0), span_ms) else 0 end as gua_ms
from steps
