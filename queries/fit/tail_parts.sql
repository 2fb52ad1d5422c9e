-- table:   tail_parts (computed on demand by `tracelat explain` and the summary; not stored)
-- grain:   one row per part of the chosen metric
-- inputs:  request_attribution
-- params:  $run_id, $metric, $t_from, $t_to
-- purpose: which parts grow in the tail (docs/model-and-attribution.md, section 6), over requests arriving in [$t_from, $t_to]:
--   growth_ms = mean part in the >= p99 group - mean part in the p40..p60 group
--   share     = growth_ms / sum(growth_ms)  (shares sum to 1; a part that shrinks is negative)
--   metric ttft: waiting_hol, waiting_capacity, waiting_step, own_prefill, unexplained, unattributed (ms)
--   metric tpot: decode parts / (output_tokens - 1): decode_baseline, prefill_interference,
--                preemption, unexplained, unattributed (ms per output token)
--   metric e2e:  every part (ms)
--   Means and the sum of growths add their terms in a fixed order (ORDER BY inside the
--   aggregate), so the same input gives the same bits whatever the threads do.
with r as (
    select *
    from request_attribution
    where run_id = $run_id and t_arrival >= $t_from and t_arrival <= $t_to
),

vals as (
    select
        req_id,
        case $metric when 'ttft' then ttft_ms when 'tpot' then tpot_ms else e2e_ms end as value,
        case $metric
            when 'ttft' then [
                {'part': 'waiting_hol', 'ms': waiting_hol_ms},
                {'part': 'waiting_capacity', 'ms': waiting_capacity_ms},
                {'part': 'waiting_step', 'ms': waiting_step_ms},
                {'part': 'own_prefill', 'ms': own_prefill_ms},
                {'part': 'unexplained', 'ms': unexplained_ttft_ms},
                {'part': 'unattributed', 'ms': unattributed_ttft_ms}
            ]
            when 'tpot' then [
                {'part': 'decode_baseline', 'ms': decode_baseline_ms / (output_tokens - 1)},
                {'part': 'prefill_interference', 'ms': prefill_interference_ms / (output_tokens - 1)},
                {'part': 'preemption', 'ms': preemption_ms / (output_tokens - 1)},
                {'part': 'unexplained', 'ms': unexplained_decode_ms / (output_tokens - 1)},
                {'part': 'unattributed', 'ms': unattributed_decode_ms / (output_tokens - 1)}
            ]
            else [
                {'part': 'waiting_hol', 'ms': waiting_hol_ms},
                {'part': 'waiting_capacity', 'ms': waiting_capacity_ms},
                {'part': 'waiting_step', 'ms': waiting_step_ms},
                {'part': 'own_prefill', 'ms': own_prefill_ms},
                {'part': 'decode_baseline', 'ms': decode_baseline_ms},
                {'part': 'prefill_interference', 'ms': prefill_interference_ms},
                {'part': 'preemption', 'ms': preemption_ms},
                {'part': 'unexplained', 'ms': unexplained_ttft_ms + unexplained_decode_ms},
                {'part': 'unattributed', 'ms': unattributed_ttft_ms + unattributed_decode_ms}
            ]
        end as parts
    from r
),

q as (
    select
        quantile_cont(value, 0.40) as p40,
        quantile_cont(value, 0.50) as p50,
        quantile_cont(value, 0.60) as p60,
        quantile_cont(value, 0.99) as p99,
        count(*) as n
    from vals
    where value is not null
),

grouped as (
    select
        v.req_id,
        v.parts,
        case when v.value >= q.p99 then 'tail' when v.value between q.p40 and q.p60 then 'median' end as grp
    from vals as v, q
    where v.value is not null
),

per_part as (
    select
        u.p.part as part,
        avg(u.p.ms order by u.p.ms) filter (where grp = 'tail') as tail_mean_ms,
        avg(u.p.ms order by u.p.ms) filter (where grp = 'median') as median_mean_ms,
        count(distinct case when grp = 'tail' then req_id end) as n_tail,
        count(distinct case when grp = 'median' then req_id end) as n_median
    from (select req_id, grp, unnest(parts) as p from grouped where grp is not null) as u
    group by all
)

select
    part,
    tail_mean_ms,
    median_mean_ms,
    tail_mean_ms - median_mean_ms as growth_ms,
    (tail_mean_ms - median_mean_ms)
    / nullif(sum(tail_mean_ms - median_mean_ms order by part) over (), 0) as share,
    n_tail,
    n_median,
    q.p50,
    q.p99,
    q.n
from per_part, q
order by growth_ms desc, part  -- part breaks ties: the same input gives the same order (and summary bytes)
