-- table:   top_spikes (computed by `tracelat fit`; kept in the stored fit numbers, not as a table)
-- grain:   one row per spike step, the $limit largest
-- inputs:  iteration_fit
-- params:  $run_id, $limit
-- purpose: the largest spikes with their timestamps:
--   excess_ms  = iteration_ms - decode_baseline_ms (time above the memory-bound decode baseline)
--   t_offset_s = t_end - the run's first t_end (seconds into the run)
--   ordered by excess_ms, largest first, ties by iter.
select
    iter, t_start, t_end, t_end - min(t_end) over () + 0.0 as t_offset_s,
    iteration_ms, predicted_ms, decode_baseline_ms, prefill_ms_part, residual_ms,
    iteration_ms - decode_baseline_ms as excess_ms,
    context_tokens, prefill_tokens, preempted_reqs, spike_cause, is_spike
from iteration_fit
where run_id = $run_id
qualify is_spike
order by excess_ms desc, iter
limit $limit
