-- table:   fit_inputs (read by `tracelat fit`; not stored)
-- grain:   one row per step of run $run_id with an iteration_ms, in time order (t_end, iter)
-- inputs:  iteration_metrics, iterations
-- params:  $run_id
-- purpose: the columns the memory-bound model and the extended model are fitted on:
--   iteration_ms ~ t0 + a*context_tokens + b*prefill_tokens + c*decode_tokens, and the
--   extended model's batch_reqs, prefill_reqs, decode_reqs and prefill_attn (the exact
--   prefill attention pairs, an extra field of simulated traces; NULL where not recorded);
--   is_dummy marks vLLM's data-parallel dummy steps (`(dummy)` lines), which are not fitted.
select m.iteration_ms, m.context_tokens, m.prefill_tokens, m.decode_tokens, m.batch_reqs, m.prefill_reqs,
       m.decode_reqs, try_cast(i.extra->>'prefill_attn' as double) as prefill_attn,
       coalesce(try_cast(i.extra->>'is_dummy' as boolean), false) as is_dummy
from iteration_metrics m left join iterations i on i.run_id = m.run_id and i.iter = m.iter
where m.run_id = $run_id and m.iteration_ms is not null
order by m.t_end, m.iter
