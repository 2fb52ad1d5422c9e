-- table:   histogram_increase (read by pipeline/engine_metrics.py for the summary; not stored)
-- grain:   one row per bucket bound le of histogram $family in run $run
-- inputs:  metric_samples
-- params:  $run, $family
-- purpose: each cumulative bucket's increase over the run, summed over label sets, as
--   Prometheus' increase(): the sum of increments between scrapes, where a drop is a counter
--   reset (the engine restarted and counted from 0 again), so the new value counts whole.
--   n = sum over scrapes of (value - previous value), or value after a drop; ordered by le
--   (pipeline/engine_metrics.py then applies histogram_quantile's linear rule).
with s as (
  select labels::varchar as lab, le, t, value,
         value - lag(value) over (partition by labels::varchar, le order by t) as d
  from metric_samples where run_id = $run and family = $family and kind = 'bucket'
)
-- a drop is a counter reset (the engine restarted): it counted from 0 again, as Prometheus' increase()
select le, sum(case when d < 0 then value else coalesce(d, 0) end order by t) as n from s group by le order by le
