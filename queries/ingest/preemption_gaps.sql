-- table:   _gaps (a temporary table of the post-ingest alignment)
-- grain:   one row per request of source $ing in run $run with token times
-- inputs:  iterations, tokens
-- params:  $run, $ing, $shift (seconds added to the source's token times: a source left on its own
--   Unix clock a few ms off the steps' is matched on its estimated offset)
-- purpose: preemptions inferred from token gaps (pipeline/ingest/align.py): each token
--   belongs to the step whose end is nearest its time (k = the step's rank by t_end);
--   dk = k - k of the previous token of the request.
--   A token read late (or stamped early) by over half a step lands on its neighbour's step: the
--   request shows dk = 2 beside dk = 0 (a late client burst: dk = 3 before two zeros) though it
--   sat out nothing. So each dk > 1 is first reduced by the run of zeros right before and right
--   after it (a zero run between two jumps cancels both: a one-step preemption beside such
--   jitter is lost, rather than every jittery read counting as one). queries/fit/request_attribution.sql
--   applies the same rule; tests check both against it written once (tests/jumps.py).
--   gaps = tokens whose reduced dk > 1 (the request sat out a step: preempted), ones = tokens
--   with dk = 1, n = tokens with a previous one. The caller trusts gaps only when tokens come
--   one per step (ones >= 0.8 n over the source).
with s as (
  select t_end, row_number() over (order by t_end, iter) as k from iterations where run_id = $run
), tk as (
  select req_id, idx, t + $shift as t from tokens where run_id = $run and ingest_id = $ing
), prev as (
  select tk.req_id, tk.idx, tk.t, s.k as k0, s.t_end as e0 from tk asof left join s on tk.t >= s.t_end
), j as (
  -- each token belongs to the step whose end is nearest: a step's tokens reach the client
  -- in a burst around its end, some just before the time it was given
  select p.req_id, p.idx, case when n.t_end is not null and (p.e0 is null or n.t_end - p.t < p.t - p.e0)
                               then n.k else p.k0 end as k
  from prev p asof left join (select t_end, k from s) n on n.t_end >= p.t
), g as (
  select req_id, idx, k - lag(k) over (partition by req_id order by idx) as dk from j
), runs as (
  -- a token with dk <> 0 opens a run; the zeros after it share its run number
  select *, count(*) filter (where dk is distinct from 0) over w as run from g
  window w as (partition by req_id order by idx rows unbounded preceding)
), heads as (
  select *, count(*) filter (where dk = 0) over (partition by req_id, run) as zeros_after from runs
), jumps as (
  -- the zeros before a token that opens a run are those of the run before it
  select *, dk - zeros_after - coalesce(lag(zeros_after) over (
           partition by req_id, dk is distinct from 0 order by idx), 0) as dk_net
  from heads
)
select req_id, count(*) filter (where dk > 1 and dk_net > 1) as gaps, count(*) filter (where dk = 1) as ones,
       count(dk) as n
from jumps group by req_id
