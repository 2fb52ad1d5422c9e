-- table:   gauge_stats (read by pipeline/engine_metrics.py for the summary; not stored)
-- grain:   one row: gauge $family over run $run
-- inputs:  metric_samples
-- params:  $run, $family
-- purpose: a gauge over time: v = the per-scrape total over label sets; mean (in time
--   order, for reproducible bits) and max of v, and the number of scrapes. The total adds the
--   label sets in one order (labels, value): a float sum's bits depend on it.
with per_t as (select t, sum(value order by labels, value) as v from metric_samples
               where run_id = $run and family = $family and kind <> 'bucket' group by t)
select avg(v order by t), max(v), count(*) from per_t
