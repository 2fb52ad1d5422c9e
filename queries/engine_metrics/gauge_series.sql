-- table:   gauge_series (read by the report's queue chart; not stored)
-- grain:   one row per (family, scrape time t) of the gauges $fams in run $run
-- inputs:  metric_samples
-- params:  $run, $fams
-- purpose: running/waiting requests and KV usage over time: v = the per-scrape total over
--   label sets of each gauge family (added in the order of labels, value: the same bits
--   whatever the rows' order); ordered by family, t.
with per_t as (
  select family, t, sum(value order by labels, value) as v from metric_samples
  where run_id = $run and family = any($fams) and kind = 'gauge' group by family, t
)
select t, family, v from per_t order by family, t
