-- table:   tail_waiting (computed on demand by `tracelat explain` for runs without steps; not stored)
-- grain:   one row
-- inputs:  request_latency
-- params:  $run_id, $metric ('ttft' or 'e2e'), $t_from, $t_to
-- purpose: what the timestamps alone say when no steps price the parts: the mean wait for a
--   batch, queue_ms = (t_scheduled - t_arrival) * 1000, in the groups of tail_parts.sql (the
--   >= p99 group and the p40..p60 group of the metric, ok requests arriving in [$t_from, $t_to]),
--   beside the metric's mean there; NULL means where no request has a scheduled time.
with vals as (
    select
        case $metric when 'ttft' then ttft_ms else e2e_ms end as value,
        queue_ms
    from request_latency
    where run_id = $run_id and status = 'ok' and t_arrival >= $t_from and t_arrival <= $t_to
),

q as (
    select
        quantile_cont(value, 0.40) as p40,
        quantile_cont(value, 0.60) as p60,
        quantile_cont(value, 0.99) as p99
    from vals
    where value is not null
)

select
    avg(v.queue_ms order by v.queue_ms) filter (where v.value >= q.p99) as tail_queue_ms,
    avg(v.value order by v.value) filter (where v.value >= q.p99 and v.queue_ms is not null) as tail_value_ms,
    avg(v.queue_ms order by v.queue_ms) filter (where v.value between q.p40 and q.p60) as median_queue_ms,
    avg(v.value order by v.value) filter (where v.value between q.p40 and q.p60 and v.queue_ms is not null)
        as median_value_ms
from vals as v, q
where v.value is not null
