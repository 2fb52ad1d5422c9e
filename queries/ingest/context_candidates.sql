-- table:   context_candidates (read by the post-ingest context estimate; not stored)
-- grain:   one row per run of $runs that has both timed steps and complete request records
-- inputs:  iterations, requests, runs
-- params:  $runs
-- purpose: whether a run's context_tokens can and should be estimated from its requests:
--   n_iter   = steps with t_start and t_end;  n_null = of them with context_tokens NULL
--   n_inside = steps inside [first arrival, last finish] of the requests (clocks agree when
--              most are: pipeline/ingest/engines/context.py skips the run below half)
--   n_req    = requests with t_first_token, t_finish and prompt_tokens
--   was_estimated = the run's meta.estimated already lists context_tokens (re-estimate those)
select i.run_id,
  count(*) as n_iter,
  count(*) filter (i.context_tokens is null) as n_null,
  count(*) filter (i.t_start >= r.t0 and i.t_end <= r.t1) as n_inside,
  any_value(r.n_req) as n_req,
  coalesce(list_contains(try_cast(json_extract(any_value(ru.meta), '$.estimated') as varchar[]), 'context_tokens'), false)
    as was_estimated
from iterations i
join (select run_id, min(t_arrival) as t0, max(t_finish) as t1, count(*) as n_req
      from requests where t_first_token is not null and t_finish is not null and prompt_tokens is not null
      group by run_id) r using (run_id)
left join runs ru using (run_id)
where i.run_id = any($runs) and i.t_start is not null and i.t_end is not null
group by i.run_id
