-- table:  iteration_metrics
-- grain:  one row per (run_id, iter)
-- inputs: iterations
-- materialize: view (re-expresses each step; the lag over a run's steps costs 0.1 s per 1M steps where read)
-- purpose: per-step time and batch composition.
--   iteration_ms = (t_end - t_start) * 1000, or dur_ms when only a duration was logged
--   gap_ms       = (t_start - previous step's t_end) * 1000: host time between steps
select
    run_id,
    iter,
    t_start,
    t_end,
    dur_ms as iteration_ms,
    prefill_tokens,
    prefill_reqs,
    decode_tokens,
    decode_reqs,
    context_tokens,
    case when prefill_reqs is not null or decode_reqs is not null
        then coalesce(prefill_reqs, 0) + coalesce(decode_reqs, 0)
    end as batch_reqs,
    case when prefill_tokens is not null or decode_tokens is not null
        then coalesce(prefill_tokens, 0) + coalesce(decode_tokens, 0)
    end as batch_tokens,
    coalesce(prefill_tokens, 0) > 0 as has_prefill,
    running_reqs,
    waiting_reqs,
    kv_usage,
    preempted_reqs,
    (t_start - lag(t_end) over (partition by run_id order by iter)) * 1000 as gap_ms
from iterations
