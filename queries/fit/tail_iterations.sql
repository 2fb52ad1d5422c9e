-- table:   tail_iterations (computed on demand by `tracelat explain`; not stored)
-- grain:   one row per step that overlaps a tail request of the chosen metric (top $limit)
-- inputs:  request_attribution, iteration_fit
-- params:  $run_id, $metric, $t_from, $t_to, $limit
-- purpose: the steps that hurt the tail most. Tail requests: metric >= p99 among requests
--   arriving in [$t_from, $t_to]. A step counts for a request when it ends inside the part
--   of its life the metric measures (ttft: arrival..first token; tpot: first token..finish;
--   e2e: arrival..finish).
--   per tail request the step delayed: prefill_ms_part + max(residual_ms, 0) + the part of its host
--   gap (the idle time before it, max(host_gap_ms, 0)) inside the request's measured interval: the
--   step's time beyond the decode baseline that the request waited through (an engine idle for
--   seconds before the request arrived delayed nothing).
--   score_ms = its sum over the tail requests; excess_ms = score_ms / tail_requests.
with r as (
    select
        req_id,
        case $metric when 'ttft' then ttft_ms when 'tpot' then tpot_ms else e2e_ms end as value,
        case $metric when 'tpot' then t_first_token else t_arrival end as ta,
        case $metric when 'ttft' then t_first_token else t_finish end as tb
    from request_attribution
    where run_id = $run_id and t_arrival >= $t_from and t_arrival <= $t_to
),

tail as (
    select r.*
    from r
    where r.value >= (select quantile_cont(value, 0.99) from r where value is not null)
),

hits as (
    select
        i.iter,
        count(*) as tail_requests,
        any_value(i.t_start) as t_start,
        any_value(i.t_end) as t_end,
        any_value(i.iteration_ms) as iteration_ms,
        any_value(i.predicted_ms) as predicted_ms,
        any_value(i.decode_baseline_ms) as decode_baseline_ms,
        any_value(i.prefill_ms_part) as prefill_ms_part,
        any_value(i.residual_ms) as residual_ms,
        any_value(i.prefill_tokens) as prefill_tokens,
        any_value(i.context_tokens) as context_tokens,
        any_value(i.preempted_reqs) as preempted_reqs,
        any_value(i.spike_cause) as spike_cause,
        sum(
            coalesce(i.prefill_ms_part, 0) + greatest(coalesce(i.residual_ms, 0), 0)
            + greatest(
                least(i.t_end - coalesce(i.iteration_ms, 0) / 1000, t.tb)
                - greatest(i.t_end - (coalesce(i.iteration_ms, 0) + greatest(coalesce(i.host_gap_ms, 0), 0)) / 1000, t.ta),
                0
            ) * 1000
        ) as score_ms
    from tail as t
    join iteration_fit as i
        on i.run_id = $run_id and i.t_end > t.ta and i.t_end <= t.tb
    group by i.iter
)

select *, score_ms / tail_requests as excess_ms
from hits
order by score_ms desc, iter
limit $limit
