-- table:   run_span (computed on demand by `tracelat explain` for its time window; not stored)
-- grain:   one row per run
-- inputs:  requests, iterations
-- params:  $run_id
-- purpose: the run's first and last times on its clock (seconds), from the base tables
--   (no derived table needed):
--   t_start = least(first arrival, first step start (its end when the start is unknown))
--   t_end   = greatest(last arrival, last step end (its start when the end is unknown))
select
    least((select min(t_arrival) from requests where run_id = $run_id),
          (select min(coalesce(t_start, t_end)) from iterations where run_id = $run_id)) as t_start,
    greatest((select max(t_arrival) from requests where run_id = $run_id),
             (select max(coalesce(t_end, t_start)) from iterations where run_id = $run_id)) as t_end
