-- table:  token_gaps
-- grain:  one row per (run_id, req_id, idx) for every output token after the first of an ok request
-- inputs: tokens, requests
-- materialize: view (each token time is stored once, in tokens)
-- purpose: inter-token latency, token-weighted: itl_ms = (t[idx] - t[idx-1]) * 1000
--   (tokens.itl_ms is computed at ingest from each request's own token_times list)
select
    t.run_id,
    t.req_id,
    t.idx,
    t.t as t_token,
    t.itl_ms
from tokens as t
semi join requests as r
    on r.run_id = t.run_id and r.req_id = t.req_id and r.status = 'ok'
where t.idx > 0
