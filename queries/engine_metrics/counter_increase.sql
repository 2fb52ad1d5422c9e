-- table:   counter_increase (read by pipeline/engine_metrics.py for the summary; not stored)
-- grain:   one row: counter $family over run $run
-- inputs:  metric_samples
-- params:  $run, $family
-- purpose: a counter's increase over the run, as Prometheus' increase(): increments summed per
--   label set (after a drop, a reset, the new value counts whole), and the scraped span
--   max(t) - min(t) in seconds (increase / span is its rate, e.g. read bytes per second).
with s as (select t, value, value - lag(value) over (partition by labels::varchar order by t) as d
           from metric_samples where run_id = $run and family = $family and kind = 'counter')
select sum(case when d < 0 then value else coalesce(d, 0) end order by t), max(t) - min(t) from s
