-- table:   ctx_est (a temporary table of the post-ingest context estimate)
-- grain:   one row per (step) of run $run
-- inputs:  iterations, requests, tokens
-- params:  $run
-- purpose: context_tokens of each step, estimated from the requests running at its midpoint
--   m = (t_start + t_end) / 2 (docs/formats.md, "Context estimates"); per running request:
--   prefill (t_scheduled <= m < t_first_token):
--       prompt_tokens * clip((t_start - t_scheduled) / (t_first_token - t_scheduled), 0, 1)
--   decode (t_first_token <= m < t_finish):
--       prompt_tokens + tokens emitted before m (ASOF join on its token times), else
--       1 + (output_tokens - 1) * min(1, (m - t_first_token) / (t_finish - t_first_token))
--   context_tokens = round(sum over the running requests);  active_reqs = how many ran.
with steps as (
  select run_id, iter, t_start, (t_start + t_end) / 2 as t_mid
  from iterations where run_id = $run
), reqs as (
  select run_id, req_id, coalesce(t_scheduled, t_arrival) as t_sched, t_first_token, t_finish,
    prompt_tokens, output_tokens
  from requests where run_id = $run and t_first_token is not null and t_finish is not null
    and prompt_tokens is not null
), active as (
  select s.iter, s.t_start, s.t_mid, r.*
  from steps s join reqs r on r.run_id = s.run_id and s.t_mid >= r.t_sched and s.t_mid < r.t_finish
), last_at as (
  -- tokens read at one instant (a client's burst) share a time: the ASOF join below picks one row
  -- of a tie, which made the estimate depend on the rows' order; each time keeps its last index
  select run_id, req_id, t, max(idx) as idx from tokens where run_id = $run group by all
), emitted as (
  -- tokens emitted before the step's midpoint: the last token at or before it
  select a.iter, a.req_id, t.idx + 1 as n_out
  from active a asof left join last_at t
    on t.run_id = a.run_id and t.req_id = a.req_id and t.t <= a.t_mid
  where a.t_mid >= a.t_first_token
), per_req as (
  select a.iter,
    case when a.t_mid < a.t_first_token then
      a.prompt_tokens * greatest(0.0, least(1.0,
        (a.t_start - a.t_sched) / nullif(a.t_first_token - a.t_sched, 0)))
    else a.prompt_tokens + coalesce(e.n_out,
      1 + greatest(coalesce(a.output_tokens, 1) - 1, 0)
          * least(1.0, (a.t_mid - a.t_first_token) / nullif(a.t_finish - a.t_first_token, 0)))
    end as ctx
  from active a left join emitted e on e.iter = a.iter and e.req_id = a.req_id
)
select s.iter, round(coalesce(sum(p.ctx), 0))::bigint as context_tokens, count(p.ctx) as active_reqs
from steps s left join per_req p on p.iter = s.iter
group by s.iter
