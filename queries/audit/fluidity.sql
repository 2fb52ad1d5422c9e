-- table:   fluidity (computed on demand by `tracelat audit` with a fluidity SLO; not stored)
-- grain:   one row per evaluated request: ok, with a TTFT, and token gaps (or a single output token)
-- inputs:  request_latency, token_gaps
-- params:  $run_id, $ttft_d, $tbt_d
-- purpose: the Etalon fluidity index of each request (pipeline/audit/measure.py derives it).
--   Token i has the gap s_0 = ttft_ms, s_i = itl_ms and the deadline D_0 = $ttft_d,
--   D_i = $tbt_d (ms). On time when s_i <= D_i + slack_{i-1}; late, the token misses
--   floor((s_i - slack_{i-1}) / $tbt_d) deadlines (the first token 1 + floor((s_0 - D_0) / $tbt_d)).
--   slack_i = max(0, slack_{i-1} + D_i - s_i) is a Lindley recursion, computed without a
--   loop as slack_i = S_i - min(0, min_{k<=i} S_k) with S_i = sum_{k<=i} (D_k - s_k).
--   deadlines = on-time tokens + missed;  fluidity_index = 1 - missed / deadlines
with req as (
    select r.req_id, r.ttft_ms
    from request_latency r
    left join (select req_id, count(*) as gaps from token_gaps where run_id = $run_id group by req_id) g
        using (req_id)
    where r.run_id = $run_id and r.status = 'ok' and r.ttft_ms is not null
        and (g.gaps > 0 or r.output_tokens = 1)
),
seq as (
    select req_id, 0 as idx, ttft_ms as s_ms, $ttft_d as d_ms from req
    union all
    select g.req_id, g.idx, g.itl_ms, $tbt_d
    from token_gaps g semi join req on req.req_id = g.req_id
    where g.run_id = $run_id
),
cum as (
    select *, sum(d_ms - s_ms) over (partition by req_id order by idx) as s_cum from seq
),
slack as (
    select
        req_id, idx, s_ms, d_ms,
        -- slack before this token: S_{i-1} - min(0, min_{k<i} S_k)
        coalesce(lag(s_cum) over w, 0)
            - least(0, coalesce(min(s_cum) over (w rows between unbounded preceding and 1 preceding), 0))
            as slack_ms
    from cum
    window w as (partition by req_id order by idx)
),
tok as (
    select
        req_id,
        s_ms <= d_ms + slack_ms as on_time,
        case
            when s_ms <= d_ms + slack_ms then 0
            when idx = 0 then 1 + floor((s_ms - d_ms) / $tbt_d)
            else floor((s_ms - slack_ms) / $tbt_d)
        end as missed
    from slack
)
select
    req_id,
    count(*) filter (where on_time) + sum(missed) as deadlines,
    sum(missed) as missed,
    1 - sum(missed) / (count(*) filter (where on_time) + sum(missed)) as fluidity_index
from tok
group by req_id
