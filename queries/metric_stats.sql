-- table:  metric_stats
-- grain:  one row per (run_id, metric); metric: every *_ms column of request_latency (ok requests),
--         itl_ms, iteration_ms (pipeline/metrics.py REGISTRY; tests/test_metric_registry.py checks they agree)
-- inputs: request_latency, token_gaps, iteration_metrics
-- purpose: distribution statistics of each metric (docs/metrics.md): linear-interpolation
--   percentiles (quantile_cont = numpy's default), sample std (ddof=1), cv = std / mean.
--   Request metrics use ok requests only.
--   mean and std add their values in sorted order (one sorted list per run and metric):
--   a float sum depends on the order of its terms, and parallel threads would combine
--   partial sums in whatever order they finish, so the same input gave other last bits.
with vals as (
    -- every per-request latency column (named *_ms) is a metric: a new one needs no edit here
    unpivot (select run_id, columns('_ms$') from request_latency where status = 'ok')
        on columns(* exclude run_id) into name metric value v
    union all
    select run_id, 'itl_ms', itl_ms from token_gaps
    union all
    select run_id, 'iteration_ms', iteration_ms from iteration_metrics
),

-- each metric's values sorted once, as a list: mean and std add them in that order, and
-- quantile_cont, min and max read the same list (three ordered aggregates sorted them three times)
sorted_vals as (
    select run_id, metric, list(v order by v) as s
    from vals
    where v is not null
    group by run_id, metric
),

stats as (
    select
        run_id,
        metric,
        len(s) as count,
        list_avg(s) as mean,
        list_stddev_samp(s) as std,
        s[1] as min,
        s[-1] as max,
        list_aggregate(s, 'quantile_cont', [0.5, 0.9, 0.95, 0.99, 0.999]) as q
    from sorted_vals
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
