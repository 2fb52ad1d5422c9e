-- table:   tail_top_requests (computed on demand by `tracelat explain`; not stored)
-- grain:   one row per request arriving in [$t_from, $t_to], the $limit slowest by the chosen metric
-- inputs:  request_attribution
-- params:  $run_id, $metric, $t_from, $t_to, $limit
-- purpose: the worst requests of the tail with their attribution:
--   value = ttft_ms, tpot_ms or e2e_ms for $metric ttft, tpot, e2e
--   unexplained_ms = unexplained_ttft_ms + unexplained_decode_ms
--   ordered by value, largest first, ties by req_id.
with r as (
    select *, case $metric when 'ttft' then ttft_ms when 'tpot' then tpot_ms else e2e_ms end as value
    from request_attribution
    where run_id = $run_id and t_arrival between $t_from and $t_to
)
select req_id, t_arrival, t_first_token, t_finish, prompt_tokens, output_tokens, preemptions,
       value, queue_ms, ttft_ms, tpot_ms, e2e_ms,
       waiting_hol_ms, waiting_capacity_ms, waiting_step_ms, own_prefill_ms, decode_baseline_ms,
       prefill_interference_ms, preemption_ms,
       unexplained_ttft_ms + unexplained_decode_ms as unexplained_ms
from r
where value is not null
order by value desc, req_id
limit $limit
