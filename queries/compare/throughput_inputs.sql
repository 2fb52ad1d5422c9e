-- table:   throughput_inputs (read by `tracelat compare` for its throughput deltas; not stored)
-- grain:   one row per run (none when the run has no summary)
-- inputs:  run_summary, requests
-- params:  $r
-- purpose: what the standard errors of a run's throughputs need (pipeline/compare.py):
--   output tokens/s = ok requests' output_tokens / duration_s; requests arrive at random
--   (compound Poisson), so SE = sqrt(sum of output_tokens^2) / duration_s: the count of requests
--   varies from run to run as much as their sizes do (sqrt(n * var) left the count's part out
--   and flagged 4 of 20 re-runs of one Poisson load at 99%). A run counted from steps gets its SE
--   from the steady-state query's windows instead (steps are no independent units).
--   requests/s: Poisson SE sqrt(requests_ok) / duration_s.
--   requests_all = every request record (a run without any has no request rate).
--   The squares are summed as exact integers: the same bits whatever the rows' order.
select s.duration_s, s.throughput_source, s.requests_ok,
       (select sum(output_tokens::hugeint * output_tokens) from requests where run_id = $r and status = 'ok')::double
           as ss_req,
       s.output_tokens_per_s, s.requests_per_s,
       (select count(*) from requests where run_id = $r) as requests_all
from run_summary s where s.run_id = $r
