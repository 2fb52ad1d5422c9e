-- table:  metric_stats
-- grain:  one row per (run_id, metric); metric in ttft_ms, tpot_ms, e2e_ms, queue_ms, prefill_ms, itl_ms, iteration_ms
-- inputs: request_latency, token_gaps, iteration_metrics
-- purpose: distribution statistics of each metric (docs/metrics.md): linear-interpolation
--   percentiles (quantile_cont = numpy's default), sample std (ddof=1), cv = std / mean.
--   Request metrics use ok requests only.
--   mean and std add their values in sorted order (ORDER BY inside the aggregate):
--   a float sum depends on the order of its terms, and parallel threads would combine
--   partial sums in whatever order they finish, so the same input gave other last bits.
with vals as (
    select run_id, 'ttft_ms' as metric, ttft_ms as v from request_latency where status = 'ok'
    union all
    select run_id, 'tpot_ms', tpot_ms from request_latency where status = 'ok'
    union all
    select run_id, 'e2e_ms', e2e_ms from request_latency where status = 'ok'
    union all
    select run_id, 'queue_ms', queue_ms from request_latency where status = 'ok'
    union all
    select run_id, 'prefill_ms', prefill_ms from request_latency where status = 'ok'
    union all
    select run_id, 'itl_ms', itl_ms from token_gaps
    union all
    select run_id, 'iteration_ms', iteration_ms from iteration_metrics
),

stats as (
    select
        run_id,
        metric,
        count(v) as count,
        avg(v order by v) as mean,
        stddev_samp(v order by v) as std,
        min(v) as min,
        max(v) as max,
        quantile_cont(v, [0.5, 0.9, 0.95, 0.99, 0.999]) as q
    from vals
    where v is not null
    group by run_id, metric
)

select
    run_id,
    metric,
    count,
    q[1] as p50,
    q[2] as p90,
    q[3] as p95,
    q[4] as p99,
    q[5] as p999,
    mean,
    std,
    min,
    max,
    std / nullif(mean, 0) as cv
from stats
