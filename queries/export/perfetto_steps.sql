-- table:   perfetto_steps (read by `tracelat export`; not stored)
-- grain:   one row per step of run $run with a start and an end time, in time order (t_end, iter)
-- inputs:  iteration_metrics
-- params:  $run
-- purpose: the engine track of the Perfetto timeline: each step as a slice from t_start to
--   t_end with its batch (prefill/decode tokens and requests, context tokens) and the
--   counters (KV usage, running and waiting requests).
select i.iter, i.t_start, i.t_end, i.iteration_ms, i.prefill_tokens, i.prefill_reqs, i.decode_tokens,
       i.decode_reqs, i.context_tokens, i.kv_usage, i.running_reqs, i.waiting_reqs, i.preempted_reqs
from iteration_metrics i where i.run_id = $run and i.t_start is not null and i.t_end is not null
order by i.t_end, i.iter
