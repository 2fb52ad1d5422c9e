-- table:   tail_outside_steps (computed on demand by `tracelat explain`; not stored)
-- grain:   one row: the requests arriving in [$t_from, $t_to] against the span of the run's steps
-- inputs:  iterations, requests
-- params:  $run_id, $t_from, $t_to
-- purpose: why time is unattributed when the log covers only part of the requests (a log cut
--   short, a client that ran on): how many requests got their first token before the first step
--   started (the first requests arrive before it as a rule) or end after the last step ended, and
--   that span (the run's clock, seconds)
with s as (
    select min(coalesce(t_start, t_end)) as first_s, max(t_end) as last_s
    from iterations
    where run_id = $run_id
)

select
    count(*) filter (where r.t_first_token < s.first_s) as before_first,
    count(*) filter (where r.t_finish > s.last_s) as after_last,
    any_value(s.first_s) as first_s,
    any_value(s.last_s) as last_s
from requests as r, s
where r.run_id = $run_id and r.t_arrival between $t_from and $t_to and s.last_s is not null
