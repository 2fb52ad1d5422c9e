-- table:  token_gaps
-- grain:  one row per (run_id, req_id, idx) for every output token after the first of an ok request
-- inputs: tokens, requests
-- purpose: inter-token latency, token-weighted: itl_ms = (t[idx] - t[idx-1]) * 1000
with ok_tokens as (
    select t.run_id, t.req_id, t.idx, t.t
    from tokens as t
    semi join requests as r
        on r.run_id = t.run_id and r.req_id = t.req_id and r.status = 'ok'
),

gaps as (
    select
        run_id,
        req_id,
        idx,
        t as t_token,
        (t - lag(t) over (partition by run_id, req_id order by idx)) * 1000 as itl_ms
    from ok_tokens
)

select * from gaps where idx > 0
