-- table:   steady_state (computed on demand by `tracelat summary` for its steady_state section; not stored)
-- grain:   one row per run (none when the run has no span: no run_summary row, or duration_s = 0)
-- inputs:  run_summary, runs, requests, token_lists, iterations
-- params:  $run_id, $max_window_s, $min_windows, $max_windows, $band, $min_span_share, $min_in_band_share
-- purpose: steady-state and peak throughput; the rule and its constants are
--   pipeline/metrics.py STEADY (docs/metrics.md, "Steady state and peak").
--   windows: n = min($max_windows, max($min_windows, ceil(duration_s / $max_window_s))) windows of
--     window_s = duration_s / n tile run_summary's span [t_first, t_last] (so the mean of the
--     windows' rates is the whole-run output_tokens_per_s; a time at t_last counts in the last one)
--   where output tokens are (run_summary's throughput_source):
--     'requests'   each ok request's N output tokens at its token_times, N / len(token_times)
--                  at each (a streamed chunk may carry several tokens); without token_times
--                  one at t_first_token and N - 1 spread evenly over (t_first_token, t_finish]
--     'iterations' decode_tokens (times the sampling interval of a sampled log) at each
--                  step's t_end (t_start when the step has no end)
--   rate_k = tokens in window k / window_s;  median_tokens_per_s = median of the busy
--   windows' rates (rate_k > 0);  in band: |rate_k - median| <= $band * median
--   steady window: first to last in-band window; reached when it covers >= $min_span_share of
--   the windows and >= $min_in_band_share of its windows are in band (else its figures are null)
--   steady_output_tokens_per_s = tokens in the steady window / steady_span_s
--   steady_requests_per_s      = ok requests finishing in it / steady_span_s
--   peak_output_tokens_per_s   = max rate_k
--   identity, over the steps ending in the steady window with decode_tokens and a duration:
--   batch_decode_tokens_mean = mean decode_tokens per step (effective batch size),
--   iteration_ms_mean, batch_per_iteration_tokens_per_s = batch * 1000 / iteration_ms_mean,
--   busy_share = step time / steady_span_s, step_decode_tokens_per_s = decode tokens / steady_span_s
--   (= batch_per_iteration_tokens_per_s * busy_share when every step has both).
--   Token and time sums are DECIMAL: exact, so the result never depends on how threads split them.
with g as (
    select
        t_first as t0,
        least($max_windows, greatest($min_windows, ceil(duration_s / $max_window_s)))::bigint as n,
        duration_s / least($max_windows, greatest($min_windows, ceil(duration_s / $max_window_s))) as w,
        throughput_source as source
    from run_summary
    where run_id = $run_id and duration_s > 0
),

sampling as (
    select coalesce(case when meta->>'decode_lines_sampled' = 'true'
                         then try_cast(meta->>'decode_log_interval' as double) end, 1.0) as per_line
    from runs where run_id = $run_id
),

ok as (
    select req_id, output_tokens, t_first_token, t_finish, t_arrival
    from requests
    where run_id = $run_id and status = 'ok'
),

listed as (
    -- the requests with token times; no list is carried here (a CTE read twice is copied)
    select l.req_id, ok.output_tokens, l.n_times,
           least(g.n - 1, greatest(0, floor((l.t_one - g.t0) / g.w)))::bigint as k_first,
           least(g.n - 1, greatest(0, floor((l.t_end - g.t0) / g.w)))::bigint as k_last
    from (
        select req_id, len(t_s) as n_times, t_s[1] as t_one, t_s[-1] as t_end
        from token_lists
        where run_id = $run_id and len(t_s) > 0
    ) as l
    join ok on l.req_id = ok.req_id
    cross join g
    where ok.output_tokens > 0 and g.source = 'requests'
),

listed_tokens as (
    -- a request whose times all fall in one window puts its N tokens there at once: only the
    -- few that cross a window boundary (a tenth on a 1M-step trace) are unnested, each time
    -- weighted N / len(token_times)
    select k_first as k, output_tokens::decimal(38, 12) as tokens from listed where k_first = k_last
    union all
    select least(g.n - 1, greatest(0, floor((t - g.t0) / g.w)))::bigint, weight
    from (
        select unnest(l.t_s) as t, (x.output_tokens / x.n_times)::decimal(38, 12) as weight
        from token_lists as l
        join listed as x on l.req_id = x.req_id
        where l.run_id = $run_id and x.k_first <> x.k_last
    ), g
),

spans as (
    select output_tokens as n_out, f, c,
           least(g.n - 1, greatest(0, floor((f - g.t0) / g.w)))::bigint as k_f,
           least(g.n - 1, greatest(0, floor((c - g.t0) / g.w)))::bigint as k_c
    from (
        select output_tokens, coalesce(t_first_token, t_finish) as f,
               greatest(coalesce(t_first_token, t_finish), coalesce(t_finish, t_first_token)) as c
        from ok
        where output_tokens > 0 and req_id not in (select req_id from listed)
    ), g
    where f is not null and g.source = 'requests'
),

spread as (
    -- share of (f, c] in window k: the first and last windows are cut at f and c, so the
    -- shares of a request add up to 1
    select k,
           ((k = k_f)::int + case when c > f
                then (n_out - 1) * (case when k = k_c then c else g.t0 + (k + 1) * g.w end
                                    - case when k = k_f then f else g.t0 + k * g.w end) / (c - f)
                else (n_out - 1) * (k = k_f)::int end)::decimal(38, 12) as tokens
    from (select *, unnest(range(k_f, k_c + 1)) as k from spans), g
),

st as (
    -- steps by the window of their end; a sampled log's line stands for per_line steps (a
    -- constant of the run, so it scales the sums)
    select least(g.n - 1, greatest(0, floor((coalesce(t_end, t_start) - g.t0) / g.w)))::bigint as k,
           count(*) filter (where decode_tokens is not null and dur_ms is not null) as steps,
           sum(decode_tokens) filter (where dur_ms is not null) as decode,
           sum(dur_ms::decimal(38, 9)) filter (where decode_tokens is not null) as dur_ms,
           (sum(decode_tokens) * any_value(sampling.per_line))::decimal(38, 12) as scaled_decode,
           sum(dur_ms::decimal(38, 9)) * any_value(sampling.per_line)::decimal(38, 9) as scaled_dur_ms
    from iterations, g, sampling
    where run_id = $run_id and coalesce(t_end, t_start) is not null
    group by all
),

tok as (
    select k, sum(tokens) as tokens
    from (
        select k, tokens from listed_tokens
        union all
        select k, tokens from spread
        union all
        select k, scaled_decode from st where (select source from g) = 'iterations' and scaled_decode is not null
    )
    group by k
),

fin as (
    select least(g.n - 1, greatest(0, floor((coalesce(t_finish, t_first_token, t_arrival) - g.t0) / g.w)))::bigint
               as k,
           count(*) as finished
    from ok, g
    group by all
),

win as (
    select w.k, g.w, coalesce(tok.tokens, 0) as tokens, coalesce(tok.tokens, 0)::double / g.w as rate,
           coalesce(fin.finished, 0) as finished, st.steps, st.decode, st.dur_ms, st.scaled_decode, st.scaled_dur_ms
    from (select unnest(range(n)) as k from g) as w
    cross join g
    left join tok using (k)
    left join fin using (k)
    left join st using (k)
),

level as (
    select median(rate) filter (where rate > 0) as m,
           count(*) filter (where rate > 0) as busy_windows,
           max(rate) as peak,
           sum(tokens) as tokens
    from win
),

band as (
    select min(k) filter (where abs(rate - m) <= $band * m) as k0,
           max(k) filter (where abs(rate - m) <= $band * m) as k1,
           count(*) filter (where abs(rate - m) <= $band * m) as in_band
    from win, level
),

held as (
    select sum(tokens) as tokens, sum(finished) as finished, sum(steps) as steps, sum(decode) as decode,
           sum(dur_ms) as dur_ms, sum(scaled_decode) as scaled_decode, sum(scaled_dur_ms) as scaled_dur_ms,
           (band.k1 - band.k0 + 1) * any_value(win.w) as span_s
    from win, band
    where win.k between band.k0 and band.k1
    group by band.k0, band.k1
),

verdict as (
    select band.*, held.*,
           (band.k1 - band.k0 + 1) >= $min_span_share * g.n
               and band.in_band >= $min_in_band_share * (band.k1 - band.k0 + 1) as reached
    from band cross join g left join held on true
)

select
    case g.source
        when 'iterations' then 'iterations'
        when 'requests' then case
            when not exists (select 1 from listed) then 'request_spans'
            when not exists (select 1 from spans) then 'token_times'
            else 'token_times+request_spans' end
    end as source,
    g.w as window_s,
    g.n as windows,
    level.busy_windows,
    level.tokens::double as tokens,
    level.m as median_tokens_per_s,
    level.peak as peak_output_tokens_per_s,
    (select min(k) from win where rate = level.peak) * g.w as peak_window_start_s,
    v.k0 * g.w as steady_start_s,
    (v.k1 + 1) * g.w as steady_end_s,
    v.k1 - v.k0 + 1 as steady_windows,
    v.in_band as in_band_windows,
    coalesce(v.reached, false) as reached,
    case when v.reached then v.tokens::double / v.span_s end as steady_output_tokens_per_s,
    case when v.reached and exists (select 1 from ok) then v.finished / v.span_s end as steady_requests_per_s,
    case when v.reached then v.tokens::double / nullif(level.tokens::double, 0) end as steady_token_share,
    case when v.reached then v.steps end as steps,
    case when v.reached then v.decode / nullif(v.steps, 0) end as batch_decode_tokens_mean,
    case when v.reached then v.dur_ms::double / nullif(v.steps, 0) end as iteration_ms_mean,
    case when v.reached then v.decode * 1000 / nullif(v.dur_ms::double, 0) end as batch_per_iteration_tokens_per_s,
    case when v.reached then v.scaled_dur_ms::double / 1000 / v.span_s end as busy_share,
    case when v.reached then v.scaled_decode::double / v.span_s end as step_decode_tokens_per_s
from g, level, verdict as v
