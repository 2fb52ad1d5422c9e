-- check:   token_times_in_order
-- grain:   one row per violating token
-- inputs:  tokens, requests
-- purpose: a request's token times do not decrease, and its first token time is t_first_token
--   (within 1 us).
with t as (
    select run_id, req_id, idx, t, lag(t) over (partition by run_id, req_id order by idx) as prev
    from tokens where run_id = $run_id
)
select t.run_id, t.req_id, t.idx, t.t,
    case when t.t < t.prev then 'token ' || t.idx || ' at ' || t.t || ' before the previous one at ' || t.prev
         else 'first token time ' || t.t || ' != t_first_token ' || r.t_first_token end as problem
from t join requests r using (run_id, req_id)
where t.t < t.prev or (t.idx = 0 and abs(t.t - r.t_first_token) > 1e-6)
