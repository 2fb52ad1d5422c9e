-- table:  token_gaps
-- grain:  one row per (run_id, req_id, idx) for every output token after the first of an ok request
-- inputs: token_lists, requests
-- materialize: view (each token time is stored once, in token_lists)
-- purpose: inter-token latency, token-weighted: itl_ms = (t[idx] - t[idx-1]) * 1000
--   (the same formula as the tokens view; idx counts from 0 at the first token)
--   Requests are filtered before their lists are unnested: a join per token cost more than the rest.
select run_id, req_id, idx, t_token, (t_token - t_prev) * 1000 as itl_ms
from (
    -- the lists unnested side by side (a list of pairs cost half as much again)
    select
        l.run_id,
        l.req_id,
        unnest(range(1, len(l.t_s)))::integer as idx,
        unnest(l.t_s[2:]) as t_token,
        unnest(l.t_s[:-2]) as t_prev
    from token_lists as l
    semi join requests as r
        on r.run_id = l.run_id and r.req_id = l.req_id and r.status = 'ok'
)
