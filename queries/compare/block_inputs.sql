-- table:   block_inputs (read by `tracelat compare` and nightly to cut a run into time blocks; not stored)
-- grain:   one row per run (none when the run has no summary)
-- inputs:  run_summary, request_latency
-- params:  $r
-- purpose: the block bootstrap's inputs (pipeline/blockboot.py, BlockRule):
--   span_s      = t_last - t_first (the run's span; NULL when unknown)
--   residence_s = mean e2e_ms / 1000 of the ok requests: how long the server's state takes to turn
--                 over; NULL for a run without request records (it gets a fixed block count)
select s.t_first,
       s.t_last - s.t_first as span_s,
       (select avg(e2e_ms) / 1000 from request_latency where run_id = $r and status = 'ok') as residence_s
from run_summary s where s.run_id = $r
