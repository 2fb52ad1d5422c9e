-- table:   request_attribution
-- grain:   one row per (run_id, req_id) of an ok request of the fitted run
-- inputs:  request_latency, fit_step_sums, tokens
-- params:  $run_id, $tol_s
-- purpose: each request's latency split over its life into the model's parts (docs/model-and-attribution.md, section 5),
--   materialised by pipeline/fit after iteration_fit. No per-request loop: every
--   interval is priced with as-of joins against running sums over the steps.
--   fit_step_sums (registered by pipeline/fit/sql.py from queries/fit/step_parts.sql):
--   per step in (t_end, iter) order, k = its rank, c_span, c_base, c_pf, c_ux, c_ua, c_hol, c_cap = running
--   sums of its span and parts up to and including it, n_span .. n_cap = the next step's
--   values, n_start = where the next step's span starts (s); plus a row at t_end = -infinity (k = 0, sums 0, n_* = the first step's) so
--   that times before the first step still match. The running sums are computed in Polars:
--   DuckDB 2.0 evaluates a windowed running sum with a segment tree, 0.4 s per column on
--   a million steps, against 0.01 s for a cumulative sum.
--   Phases: wait (t_arrival, t_scheduled], prefill (t_scheduled, t_first_token],
--   decode (t_first_token, t_finish]. A phase of L ms is split in the proportions of
--   the steps whose spans overlap it, each weighted by its overlap (the step in progress
--   at the phase's start less its part before the start, the steps that ended inside,
--   the step in progress at the end up to the end); the step in progress when none ended inside:
--     per step: decode baseline | prefill part | unexplained (residual + host gap) | unattributed
--     wait:    baseline + prefill part -> waiting_hol when the step computed others' prompts and was
--              not full, else -> waiting_capacity (step_parts.sql: hol_ms, cap_ms); of the step in
--              progress at arrival, when it was neither full nor prefilling anyone -> waiting_step
--              (admission waits for the step's end; no limit held the request)
--     prefill: baseline + prefill part -> own_prefill
--     decode:  baseline -> decode_baseline, prefill part -> prefill_interference
--     all:     residual + host gap -> unexplained; steps without a prediction -> unattributed
--   Preemption (decode phase): with token times, every token gap that spans more than
--   one step means the request sat out steps; the whole gap is preemption. Only requests
--   whose preemptions is not 0 (or unknown) are examined token by token. Without
--   token times, a request with preemptions > 0 that spans n steps but emitted only
--   output_tokens - 1 tokens after the first sat out the difference: that fraction of
--   the decode phase is preemption. The other parts are scaled to what is left.
--   Token gaps show steps sat out only when the request's tokens reach the client about one
--   per step (at most 20% of its gaps inside one step, at least half over exactly one, judged
--   on 3 gaps or more) and its source is not bursty (more than half of its judged requests
--   bursty, when 3 or more are judged): a client that gets tokens in bursts (a lagging frontend, a stream interval) sees
--   gaps over many steps that no preemption made. Then a request known to be preempted is
--   priced from step counts, and one not known either way ('bursty') gets no preemption part.
--   A jump beside gaps inside one step is a read moved across a step end, not a preemption
--   (reduced as in queries/ingest/preemption_gaps.sql).
--   $tol_s: a request time matches a step ending up to this much later (clock rounding).
-- running sums over the steps (t_end order) with a row at -infinity; built from step_parts.sql
with cum0 as (
    select * from fit_step_sums
),

req as (
    select *
    from request_latency
    where run_id = $run_id and status = 'ok'
),

phases as (
    select req_id, 'wait' as phase, t_arrival as ta, t_scheduled as tb from req
    union all
    select req_id, 'prefill', t_scheduled, t_first_token from req
    union all
    select req_id, 'decode', t_first_token, t_finish from req
),

-- the phase's edges: the part of the step in progress at its start that lies before the start
-- (priced out), and of the step in progress at its end that lies before the end (priced in). A
-- step's span is the host gap since the step before ended (unexplained; unattributed when the step has
-- no prediction), then the step itself at its own proportions: a phase inside the step is priced at
-- the step's parts, one inside the gap as the gap (an idle engine before a request's prefill
-- step is not its prefill, and its prefill is not the gap). u = ms of the span before the edge, q =
-- the share of the step proper before it. y.n_* is NULL after the last step.
priced as (
    select
        p.req_id,
        p.phase,
        (p.tb - p.ta) * 1000 as len_ms,
        least(greatest((p.ta - x.n_start) * 1000, 0), x.n_span) as u_h,
        least(greatest((p.tb - y.n_start) * 1000, 0), y.n_span) as u_t,
        case when x.n_span > x.n_gux + x.n_gua
            then greatest(u_h - x.n_gux - x.n_gua, 0) / (x.n_span - x.n_gux - x.n_gua) else 0 end as q_h,
        case when y.n_span > y.n_gux + y.n_gua
            then greatest(u_t - y.n_gux - y.n_gua, 0) / (y.n_span - y.n_gux - y.n_gua) else 0 end as q_t,
        y.k - x.k as n_steps,
        y.c_span - x.c_span as d_span,
        -- the phase's time: the steps that ended in it less the head, plus the tail (u: the span
        -- before an edge); within one step's span, the time between its edges
        d_span - coalesce(u_h, 0) + coalesce(u_t, 0) as e_span,
        -- fractions of the phase: from the span it overlaps, else the step in progress
        case when e_span > 0
                then (y.c_base - x.c_base - coalesce((x.n_base * q_h), 0) + coalesce((y.n_base * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_base / x.n_span end as f_base,
        case when e_span > 0
                then (y.c_pf - x.c_pf - coalesce((x.n_pf * q_h), 0) + coalesce((y.n_pf * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_pf / x.n_span end as f_pf,
        case when e_span > 0
                then (y.c_ux - x.c_ux - coalesce((least(u_h, x.n_gux) + (x.n_ux - x.n_gux) * q_h), 0) + coalesce((least(u_t, y.n_gux) + (y.n_ux - y.n_gux) * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_ux / x.n_span end as f_ux,
        case when e_span > 0
                then (y.c_ua - x.c_ua - coalesce((least(u_h, x.n_gua) + (x.n_ua - x.n_gua) * q_h), 0) + coalesce((least(u_t, y.n_gua) + (y.n_ua - y.n_gua) * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_ua / x.n_span end as f_ua,
        case when e_span > 0
                then (y.c_hol - x.c_hol - coalesce((x.n_hol * q_h), 0) + coalesce((y.n_hol * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_hol / x.n_span end as f_hol,
        case when e_span > 0
                then (y.c_cap - x.c_cap - coalesce((x.n_cap * q_h), 0) + coalesce((y.n_cap * q_t), 0)) / e_span
             when x.n_span > 0 then x.n_cap / x.n_span end as f_cap,
        -- the step in progress at the phase's start, when neither full nor prefilling anyone: the
        -- wait for it to end (its share of the phase), a part of f_cap
        case when e_span > 0
                then (case when y.k > x.k then x.n_bnd * (1 - q_h) else x.n_bnd * (q_t - q_h) end) / e_span
             when x.n_span > 0 then x.n_bnd / x.n_span end as f_bnd,
        y.c_base - x.c_base as d_base,
        y.c_pf - x.c_pf as d_pf,
        y.c_ux - x.c_ux as d_ux,
        y.c_ua - x.c_ua as d_ua
    from phases as p
    asof left join cum0 as x on p.ta + $tol_s >= x.t_end
    asof left join cum0 as y on p.tb + $tol_s >= y.t_end
    where p.ta is not null and p.tb is not null
),

-- only requests that may have been preempted (preemptions > 0, or unknown) are examined token by token
maybe_preempted as (
    select req_id from req where coalesce(preemptions, 1) > 0
),

-- each token matched to the step that emitted it (the last step ending at or before it)
token_steps as (
    select
        t.req_id,
        t.ingest_id,
        t.idx,
        t.t,
        x.k,
        x.c_span,
        x.c_base,
        x.c_pf,
        x.c_ux,
        x.c_ua
    from tokens as t
    semi join maybe_preempted as m on m.req_id = t.req_id
    asof left join cum0 as x on t.t + $tol_s >= x.t_end
    where t.run_id = $run_id
),

token_gaps0 as (
    select
        req_id,
        ingest_id,
        idx,
        (t - lag(t) over w) * 1000 as gap_ms,
        k - lag(k) over w as n_steps,
        c_span - lag(c_span) over w as d_span,
        c_base - lag(c_base) over w as d_base,
        c_pf - lag(c_pf) over w as d_pf,
        c_ux - lag(c_ux) over w as d_ux,
        c_ua - lag(c_ua) over w as d_ua
    from token_steps
    window w as (partition by req_id order by idx)
),

-- per request: its gaps inside one step, over exactly one, and its longest
req_gaps as (
    select req_id, any_value(ingest_id) as ingest_id, count(n_steps) as n,
           count(*) filter (where n_steps = 0) as zeros, count(*) filter (where n_steps = 1) as ones,
           max(n_steps) as most
    from token_gaps0
    group by req_id
),

-- a read moved across a step end (client lag, a burst after a client stall) shows as a jump beside
-- gaps inside one step: each jump is reduced by the run of zero-step gaps right before and after it
-- (the rule of queries/ingest/preemption_gaps.sql; tests check both against tests/jumps.py); only what
-- is left is steps sat out. Only the requests with a jump are looked at so (the three windows cost
-- more than the rest on big runs)
token_runs as (
    select *, count(*) filter (where n_steps is distinct from 0) over (
        partition by req_id order by idx rows unbounded preceding) as run
    from token_gaps0
    semi join (select req_id from req_gaps where most > 1) as j on j.req_id = token_gaps0.req_id
),

token_gaps as (
    select *, n_steps - zeros_after - coalesce(lag(zeros_after) over (
               partition by req_id, n_steps is distinct from 0 order by idx), 0) as n_net
    from (select *, count(*) filter (where n_steps = 0) over (partition by req_id, run) as zeros_after
          from token_runs)
),

-- token gaps that span more than one step: the request was out of the batch
preempted_gaps as (
    select
        req_id,
        -- terms in a fixed order: a float sum of three or more depends on it (reproducible bits)
        sum(gap_ms order by gap_ms) as gap_ms,
        sum(d_span order by d_span) as d_span,
        sum(d_base order by d_base) as d_base,
        sum(d_pf order by d_pf) as d_pf,
        sum(d_ux order by d_ux) as d_ux,
        sum(d_ua order by d_ua) as d_ua
    from token_gaps
    where n_steps > 1 and n_net > 1
    group by req_id
),

has_tokens as (
    select distinct req_id from token_steps
),

-- each request's cadence: bursts show as gaps inside one step, a client reading every other step as
-- gaps over two; a preemption is a few jumps only. Judged on 3 gaps or more (a 2-token request's one
-- gap says nothing of its cadence). A frontend that lags under load sends bursts to most requests,
-- also to those that got their first tokens one per step before it fell behind: when more than half
-- of a source's judged requests (3 or more) came in bursts, all of them did
req_cadence as (
    select req_id, ingest_id, case when n >= 3 then zeros <= 0.2 * n and ones >= 0.5 * n end as own
    from req_gaps
),

cadence as (
    select req_id, coalesce(own, true)
               and not (count(own) over s >= 3 and count(*) filter (where not own) over s > 0.5 * count(own) over s)
               as one_per_step
    from req_cadence
    window s as (partition by ingest_id)
),

decode as (
    select
        p.req_id,
        p.len_ms,
        case
            when h.req_id is not null and c.one_per_step then 'token_times'
            when r.preemptions > 0 then 'step_counts'
            when h.req_id is not null and r.preemptions is null then 'bursty'
            else 'none'
        end as preemption_method,
        case
            when h.req_id is not null and c.one_per_step then coalesce(g.gap_ms, 0)
            when r.preemptions > 0 and p.n_steps > 0
                then p.len_ms * greatest(p.n_steps - (r.output_tokens - 1), 0) / p.n_steps
            else 0
        end as preempt_ms,
        -- span and parts of the steps the request was in
        p.d_span - coalesce(g.d_span, 0) as k_span,
        p.d_base - coalesce(g.d_base, 0) as k_base,
        p.d_pf - coalesce(g.d_pf, 0) as k_pf,
        p.d_ux - coalesce(g.d_ux, 0) as k_ux,
        p.d_ua - coalesce(g.d_ua, 0) as k_ua,
        p.f_base,
        p.f_pf,
        p.f_ux,
        p.f_ua
    from priced as p
    join req as r on r.req_id = p.req_id
    left join cadence as c on c.req_id = p.req_id
    left join has_tokens as h on h.req_id = p.req_id
    -- gaps count only where tokens come one per step (k_* below then keep every step)
    left join preempted_gaps as g on g.req_id = p.req_id and c.one_per_step
    where p.phase = 'decode'
),

decode_parts as (
    select
        req_id,
        preemption_method,
        preempt_ms,
        len_ms - preempt_ms as rest_ms,
        case when k_span > 0 then k_base / k_span else f_base end as g_base,
        case when k_span > 0 then k_pf / k_span else f_pf end as g_pf,
        case when k_span > 0 then k_ux / k_span else f_ux end as g_ux,
        case when k_span > 0 then k_ua / k_span else f_ua end as g_ua
    from decode
),

ttft_parts as (
    select
        req_id,
        sum(case when phase = 'wait' then len_ms * f_hol end) as waiting_hol_ms,
        sum(case when phase = 'wait' then len_ms * (f_cap - coalesce(f_bnd, 0)) end) as waiting_capacity_ms,
        sum(case when phase = 'wait' then len_ms * f_bnd end) as waiting_step_ms,
        sum(case when phase = 'prefill' then len_ms * (f_base + f_pf) end) as own_prefill_ms,
        sum(len_ms * f_ux) as unexplained_ttft_ms,
        sum(len_ms * coalesce(f_ua, 1)) as unattributed_ttft_ms
    from priced
    where phase in ('wait', 'prefill')
    group by req_id
)

select
    r.run_id,
    r.req_id,
    r.t_arrival,
    r.t_scheduled,
    r.t_first_token,
    r.t_finish,
    r.prompt_tokens,
    r.output_tokens,
    r.preemptions,
    r.queue_ms,
    r.ttft_ms,
    r.tpot_ms,
    r.e2e_ms,
    coalesce(t.waiting_hol_ms, 0) as waiting_hol_ms,
    coalesce(t.waiting_capacity_ms, 0) as waiting_capacity_ms,
    coalesce(t.waiting_step_ms, 0) as waiting_step_ms,
    coalesce(t.own_prefill_ms, 0) as own_prefill_ms,
    coalesce(t.unexplained_ttft_ms, 0) as unexplained_ttft_ms,
    -- a TTFT without a scheduled time (or steps) cannot be split: all of it is unattributed
    case when t.req_id is null then r.ttft_ms else t.unattributed_ttft_ms end as unattributed_ttft_ms,
    coalesce(d.rest_ms * d.g_base, 0) as decode_baseline_ms,
    coalesce(d.rest_ms * d.g_pf, 0) as prefill_interference_ms,
    coalesce(d.preempt_ms, 0) as preemption_ms,
    coalesce(d.rest_ms * d.g_ux, 0) as unexplained_decode_ms,
    case
        when d.req_id is null then (r.t_finish - r.t_first_token) * 1000
        else d.rest_ms * coalesce(d.g_ua, 1)
    end as unattributed_decode_ms,
    coalesce(d.preemption_method, 'none') as preemption_method
from req as r
left join ttft_parts as t on t.req_id = r.req_id
left join decode_parts as d on d.req_id = r.req_id
