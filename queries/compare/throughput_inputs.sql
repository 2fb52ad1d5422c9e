-- table:   throughput_inputs (read by `tracelat compare` for its throughput deltas; not stored)
-- grain:   one row per run (none when the run has no summary)
-- inputs:  run_summary, requests, iterations
-- params:  $r
-- purpose: what the standard errors of a run's throughputs need (pipeline/compare.py):
--   output tokens/s = a sum over units / duration_s, SE = sqrt(n * var(per-unit tokens)) / duration_s
--   with units = ok requests (var_samp(output_tokens)) or, for runs whose throughput comes
--   from steps, steps (var_samp(decode_tokens)); requests/s: Poisson SE sqrt(requests_ok) / duration_s.
--   requests_all = every request record (a run without any has no request rate).
--   The variances run over the values in order: the same bits whatever the rows' order.
select s.duration_s, s.throughput_source, s.requests_ok,
       (select count(*) from requests where run_id = $r and status = 'ok') as n_req,
       (select var_samp(output_tokens order by output_tokens) from requests where run_id = $r and status = 'ok') as var_req,
       (select count(*) from iterations where run_id = $r) as n_it,
       (select var_samp(decode_tokens order by decode_tokens) from iterations where run_id = $r) as var_it,
       s.output_tokens_per_s, s.requests_per_s,
       (select count(*) from requests where run_id = $r) as requests_all
from run_summary s where s.run_id = $r
