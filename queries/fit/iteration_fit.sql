-- table:   iteration_fit
-- grain:   one row per (run_id, iter) of the fitted run
-- inputs:  iteration_metrics, iterations
-- params:  $run_id, $t0_ms, $a_ms_per_ctx, $b_ms_per_prefill, $c_ms_per_decode, $log_center, $log_scale, $k
-- purpose: the memory-bound model's parts of every step (docs/model-and-attribution.md, section 4), materialised by
--   pipeline/fit (not by the derived-table runner: it needs the fitted coefficients). Data-parallel
--   dummy steps (iterations.extra.is_dummy) get no prediction: they are not fitted.
--   decode_baseline_ms = t0 + a*context_tokens + c*decode_tokens   (memory-bound decode)
--   prefill_ms_part    = b*prefill_tokens
--   predicted_ms       = decode_baseline_ms + prefill_ms_part
--   residual_ms        = iteration_ms - predicted_ms;  rel_residual = residual_ms / predicted_ms
--   span_ms            = (t_end - previous t_end) * 1000: the step plus the host gap before it
--   host_gap_ms        = span_ms - iteration_ms
--   log_residual       = ln(iteration_ms / predicted_ms)
--   is_stall           = log_residual > log_center + k * log_scale  (robust: median + k x 1.4826 MAD)
--   is_spike           = is_stall, or ln(iteration_ms / decode_baseline_ms) beyond the same threshold
--   spike_cause        = 'preemption' (a stall in a step that preempted), 'unexplained' (other stalls),
--                        'prefill' (a spike the prefill part explains), null otherwise
--   A coefficient of 0 is a term that was not fitted: its column may be null.
--   Data-parallel dummy steps (vLLM's "(dummy)" lines, extra.is_dummy) are padding that keeps
--   the ranks in step, not work: they were not fitted, so they get no prediction (NULL parts,
--   never a stall; request attribution counts their span as unattributed).
with dummy as (
    select iter
    from iterations
    where run_id = $run_id and coalesce(try_cast(extra->>'is_dummy' as boolean), false)
),

it as (
    select
        m.run_id,
        m.iter,
        m.t_start,
        m.t_end,
        m.iteration_ms,
        m.context_tokens,
        m.prefill_tokens,
        m.decode_tokens,
        m.preempted_reqs,
        case when d.iter is null then
            $t0_ms
            + case when $a_ms_per_ctx = 0 then 0 else $a_ms_per_ctx * m.context_tokens end
            + case when $c_ms_per_decode = 0 then 0 else $c_ms_per_decode * m.decode_tokens end
        end as decode_baseline_ms,
        case when d.iter is null then
            case when $b_ms_per_prefill = 0 then 0 else $b_ms_per_prefill * m.prefill_tokens end
        end as prefill_ms_part,
        coalesce(
            (m.t_end - lag(m.t_end) over (order by m.t_end, m.iter)) * 1000, m.iteration_ms
        ) as span_ms
    from iteration_metrics m
    left join dummy d on d.iter = m.iter
    where m.run_id = $run_id
),

parts as (
    select
        *,
        decode_baseline_ms + prefill_ms_part as predicted_ms,
        iteration_ms - (decode_baseline_ms + prefill_ms_part) as residual_ms,
        (iteration_ms - (decode_baseline_ms + prefill_ms_part))
        / greatest(decode_baseline_ms + prefill_ms_part, 1e-9) as rel_residual,
        case when iteration_ms > 0 and decode_baseline_ms + prefill_ms_part > 0
            then ln(iteration_ms / (decode_baseline_ms + prefill_ms_part)) end as log_residual,
        case when iteration_ms > 0 and decode_baseline_ms > 0
            then ln(iteration_ms / decode_baseline_ms) end as log_over_baseline,
        span_ms - iteration_ms as host_gap_ms
    from it
),

flags as (
    select
        *,
        coalesce(log_residual > $log_center + $k * $log_scale, false) as is_stall,
        coalesce(log_over_baseline > $log_center + $k * $log_scale, false) as over_baseline
    from parts
)

select
    run_id,
    iter,
    t_start,
    t_end,
    iteration_ms,
    span_ms,
    host_gap_ms,
    context_tokens,
    prefill_tokens,
    decode_tokens,
    preempted_reqs,
    predicted_ms,
    decode_baseline_ms,
    prefill_ms_part,
    residual_ms,
    rel_residual,
    log_residual,
    is_stall,
    is_stall or (over_baseline and coalesce(prefill_tokens, 0) > 0) as is_spike,
    case
        when is_stall and coalesce(preempted_reqs, 0) > 0 then 'preemption'
        when is_stall then 'unexplained'
        when over_baseline and coalesce(prefill_tokens, 0) > 0 then 'prefill'
    end as spike_cause
from flags
