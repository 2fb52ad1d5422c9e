-- table:  metric_stats
-- grain:  one row per (run_id, metric); metric: every *_ms column of request_latency (ok requests),
--         itl_ms, iteration_ms (pipeline/metrics.py REGISTRY; tests/test_metric_registry.py checks they agree)
-- inputs: request_latency, token_gaps, iteration_metrics
-- purpose: distribution statistics of each metric (docs/metrics.md): linear-interpolation
--   percentiles (quantile_cont = numpy's default), sample std (ddof=1), cv = std / mean.
--   Request metrics use ok requests only.
--   mean and std are sums of fixed-point numbers (exact, see moments): a float sum depends on
--   the order of its terms, and parallel threads combine partial sums in whatever order they
--   finish, so the same input gave other last bits; an exact sum has one value.
with vals as materialized (
    -- every per-request latency column (named *_ms) is a metric: a new one needs no edit here
    unpivot (select run_id, columns('_ms$') from request_latency where status = 'ok')
        on columns(* exclude run_id) into name metric value v
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
        min(v) as min,
        max(v) as max,
        max(v) - min(v) as span,
        quantile_cont(v, [0.5, 0.9, 0.95, 0.99, 0.999]) as q,
        -- a first mean: values to 1e-10 ms, summed exactly (moments refines it)
        sum(v::decimal(38, 10))::double / count(v) as mean0
    from vals
    where v is not null
    group by run_id, metric
),

moments as (
    -- deviations from mean0 in units of the range, d = (v - mean0) / span in [-1, 1], and their
    -- squares, to 24 decimals, summed exactly: a term's rounding moves a sum by at most 1e-24
    select run_id, metric,
        sum(d::decimal(38, 24))::double as sum_d,
        sum((d * d)::decimal(38, 24))::double as sum_dd
    from (
        select x.run_id, x.metric, (x.v - s.mean0) / s.span as d
        from vals x join stats s on s.run_id = x.run_id and s.metric = x.metric and s.span > 0
        where x.v is not null
    )
    group by run_id, metric
),

final as (
    -- mean = mean0 + span * sum(d) / n; var = span^2 * (sum(d^2) - sum(d)^2 / n) / (n - 1)
    select s.*,
        case when s.span > 0 then s.mean0 + s.span * m.sum_d / s.count else s.min end as mean,
        case when s.count > 1 then
            case when s.span > 0
                then s.span * sqrt(greatest(m.sum_dd - m.sum_d * m.sum_d / s.count, 0) / (s.count - 1))
                else 0 end
        end as std
    from stats s
    left join moments m on m.run_id = s.run_id and m.metric = s.metric
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
from final
