-- table:  metric_stats
-- grain:  one row per (run_id, metric); metric: every *_ms column of request_latency (ok requests),
--         itl_ms, iteration_ms (pipeline/metrics.py REGISTRY; tests/test_metric_registry.py checks they agree)
-- inputs: request_latency, iteration_metrics, token_lists, requests
-- purpose: distribution statistics of each metric (docs/metrics.md): linear-interpolation
--   percentiles (quantile_cont = numpy's default), sample std (ddof=1), cv = std / mean.
--   Request metrics use ok requests only.
--   mean and std are sums of fixed-point numbers (exact, see moments): a float sum depends on
--   the order of its terms, and parallel threads combine partial sums in whatever order they
--   finish, so the same input gave other last bits; an exact sum has one value.
--   itl_ms is read as each ok request's list of gaps (the token_gaps formula), never a row per
--   token with its run and metric name: that copy cost more than all the statistics.
with gaps as materialized (
    -- itl_ms = (t[i] - t[i-1]) * 1000: each ok request's list of gaps, built once for both passes
    -- (x is t[i + 1], the lambda's i counting from 1). A token list is stored with its request
    -- (pipeline/ingest/load.py), so the lists of ok requests are those of no other request:
    -- the join's table is then the few requests that are not ok, not all of them (a tenth of
    -- the statement's time on 120k requests)
    select l.run_id, list_transform(l.t_s[2:], lambda x, i: (x - l.t_s[i]) * 1000) as g
    from token_lists as l
    anti join (select run_id, req_id from requests where status is distinct from 'ok') as r
        on r.run_id = l.run_id and r.req_id = l.req_id
    where len(l.t_s) > 1
),

rowvals as materialized (
    -- every per-request latency column (named *_ms) is a metric: a new one needs no edit here
    unpivot (select run_id, columns('_ms$') from request_latency where status = 'ok')
        on columns(* exclude run_id) into name metric value v
    union all
    select run_id, 'iteration_ms', iteration_ms from iteration_metrics
),


stats as (
    select run_id, metric, count(v) as count, min(v) as min, max(v) as max, max(v) - min(v) as span,
        quantile_cont(v, [0.5, 0.9, 0.95, 0.99, 0.999]) as q
    from rowvals where v is not null group by run_id, metric
    union all
    select run_id, 'itl_ms', count(v), min(v), max(v), max(v) - min(v),
        quantile_cont(v, [0.5, 0.9, 0.95, 0.99, 0.999])
    from (select run_id, unnest(g) as v from gaps)
    group by run_id
),

moments as (
    -- deviations from the median in units of the range, d = (v - p50) / span in [-1, 1], and
    -- their squares, to 24 decimals, summed exactly: a term's rounding moves a sum by at most
    -- 1e-24. The median is within one std of the mean, so sum(d)^2 / n is at most about
    -- sum(d^2) / 2: the subtraction below loses at most a bit.
    select x.run_id, x.metric,
        sum(((x.v - s.q[1]) / s.span)::decimal(38, 24))::double as sum_d,
        sum((((x.v - s.q[1]) / s.span) ** 2)::decimal(38, 24))::double as sum_dd
    from rowvals as x join stats as s on s.run_id = x.run_id and s.metric = x.metric and s.span > 0
    where x.v is not null
    group by x.run_id, x.metric
    union all
    -- itl_ms: one list of d per ok request, d = ((t[i] - t[i-1]) * 1000 - p50) / span (the
    -- token_gaps formula); a list's sums are taken within the list, a fixed order (the same bits
    -- every time), then summed exactly like the rows' terms above. sum(d^2) is the list's dot
    -- product with itself: a third of the time of squaring each term in a lambda
    select run_id, 'itl_ms',
        sum(list_sum(d)::decimal(38, 24))::double,
        sum(list_dot_product(d, d)::decimal(38, 24))::double
    from (
        select x.run_id, list_transform(x.g, lambda v: (v - s.q[1]) / s.span) as d
        from gaps as x
        join stats as s on s.run_id = x.run_id and s.metric = 'itl_ms' and s.span > 0
    )
    group by run_id
),

final as (
    -- mean = p50 + span * sum(d) / n; var = span^2 * (sum(d^2) - sum(d)^2 / n) / (n - 1)
    select s.*,
        case when s.span > 0 then s.q[1] + s.span * m.sum_d / s.count else s.min end as mean,
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
