-- table:   stall_stats (computed by `tracelat fit` for the stored fit numbers; not stored as a table)
-- grain:   one row per run
-- inputs:  iteration_fit
-- params:  $run_id
-- purpose: spike counts by cause and the size distribution of stalls (residual ms), see
--   docs/model-and-attribution.md section 4:
--   n       = steps with a prediction; spikes = steps flagged is_spike, split by spike_cause
--   stalls  = steps flagged is_stall; mean/p50/p90/p99/max/total of their residual_ms
--   step_ms = [p50, p90] of predicted_ms (pipeline/fit/stalls.py turns it into the detection limit)
--   Sums add in a fixed order, so the same steps give the same bits (threads combine in any order).
select
    count(*) filter (where predicted_ms is not null) as n,
    count(*) filter (where is_spike) as spikes,
    count(*) filter (where spike_cause = 'prefill') as prefill,
    count(*) filter (where spike_cause = 'preemption') as preemption,
    count(*) filter (where spike_cause = 'unexplained') as unexplained,
    count(*) filter (where is_stall) as stalls,
    avg(residual_ms order by residual_ms) filter (where is_stall) as mean_ms,
    quantile_cont(residual_ms, 0.5) filter (where is_stall) as p50_ms,
    quantile_cont(residual_ms, 0.9) filter (where is_stall) as p90_ms,
    quantile_cont(residual_ms, 0.99) filter (where is_stall) as p99_ms,
    max(residual_ms) filter (where is_stall) as max_ms,
    sum(residual_ms order by residual_ms) filter (where is_stall) as total_ms,
    quantile_cont(predicted_ms, [0.5, 0.9]) as step_ms
from iteration_fit
where run_id = $run_id
