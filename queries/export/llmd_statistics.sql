-- table:   llmd_statistics (read by pipeline/export/llmd.py for `tracelat export --llm-d`; not stored)
-- grain:   one row per quantity of the run $run_id that has at least one value
-- inputs:  request_latency, token_gaps, iteration_metrics, iterations
-- params:  $run_id
-- purpose: the distributions behind the `Statistics` objects of an llm-d Benchmark Report
--   v0.2.1: linear-interpolation percentiles (quantile_cont, as metric_stats), sample std.
--   Request quantities use ok requests, as `tracelat summary` does:
--     ttft_ms, tpot_ms, e2e_ms (request_latency), itl_ms (token_gaps, one per token gap),
--     ntpot_ms = e2e_ms / output_tokens (llm-d's "normalized time per output token",
--     first token included), prompt_tokens, output_tokens.
--   Step quantities (engine side), over steps that are not data-parallel dummy steps:
--     kv_usage_pct = kv_usage * 100, running_reqs, waiting_reqs.
--   mean and std add in sorted order so that the same run gives the same bits.
with ok as (
    select * from request_latency where run_id = $run_id and status = 'ok'
),

steps as (
    select m.kv_usage, m.running_reqs, m.waiting_reqs
    from iteration_metrics m
    left join iterations i on i.run_id = m.run_id and i.iter = m.iter
    where m.run_id = $run_id and not coalesce(try_cast(i.extra->>'is_dummy' as boolean), false)
),

vals as (
    select 'ttft_ms' as quantity, ttft_ms as v from ok
    union all
    select 'tpot_ms', tpot_ms from ok
    union all
    select 'e2e_ms', e2e_ms from ok
    union all
    select 'ntpot_ms', e2e_ms / output_tokens from ok where output_tokens > 0
    union all
    select 'prompt_tokens', prompt_tokens from ok
    union all
    select 'output_tokens', output_tokens from ok
    union all
    select 'itl_ms', itl_ms from token_gaps where run_id = $run_id
    union all
    select 'kv_usage_pct', kv_usage * 100 from steps
    union all
    select 'running_reqs', running_reqs from steps
    union all
    select 'waiting_reqs', waiting_reqs from steps
)

select
    quantity,
    count(v) as n,
    avg(v order by v) as mean,
    stddev_samp(v order by v) as stddev,
    min(v) as min,
    max(v) as max,
    quantile_cont(v, [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]) as q
from vals
where v is not null and isfinite(v)
group by quantity
order by quantity
