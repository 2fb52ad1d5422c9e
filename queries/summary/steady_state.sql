-- table:   steady_state (computed on demand by `tracelat summary` for its steady_state section; not stored)
-- grain:   one row per run (none when the run has no span: no run_summary row, or duration_s = 0)
-- inputs:  run_summary, runs, requests, token_lists, iterations
-- params:  $run_id, $t0, $t1 (the span to window: null = run_summary's [t_first, t_last]),
--          $max_window_s, $min_windows, $max_windows, $band, $edge_share, $noise_z, $max_noise, $max_scatter,
--          $min_span_share,
--          $ramp_guard, $min_in_band_share, $stretch_tail, $min_interval_windows, $max_lag1
-- purpose: steady-state and peak throughput; the rule and its constants are
--   pipeline/metrics.py STEADY (docs/metrics.md, "Steady state and peak").
--   windows: n = min($max_windows, max($min_windows, ceil(d / $max_window_s))) windows of
--     w = d / n tile the span [t0, t1], d = t1 - t0 (a time at t1 counts in the last one;
--     times outside the span are left out, never clamped into an edge window)
--   where output tokens are (run_summary's throughput_source):
--     'requests'   each ok request's N output tokens at its token_times, N / len(token_times)
--                  at each (a streamed chunk may carry several tokens); without token_times
--                  one at t_first_token and N - 1 spread evenly over (t_first_token, t_finish]
--     'iterations' decode_tokens (times the sampling interval of a sampled log) at each
--                  step's t_end (t_start when the step has no end)
--   x_ik = tokens of unit i (an ok request; a step) in window k; rate_k = sum_i x_ik / w
--   noise  = sqrt(busy_windows * sum_ik x_ik^2) / tokens: a busy window's relative counting
--            noise (compound Poisson; 1 / sqrt(units' worth of tokens per window))
--   scatter = a steps-only run's (source 'iterations') scatter of window rates: 1.4826 * median
--            |d_k - median(d)| / sqrt(2) / median(rate) over the busy span, d_k = rate_k - rate_{k-1}
--   beta   = max($band, $noise_z * noise, $noise_z * min(scatter, $max_scatter) if steps only): the band's
--            half-width; in band at level L:
--            L / (1 + beta) <= s_k <= L * (1 + beta)
--   s_k    = median(rate_{k-1}, rate_k, rate_{k+1}) (a one-window burst or dip is smoothed out)
--   level  = the busy windows' s_k near the mode: the s_j whose band holds the most tokens,
--            then the median of the s_k in its band (level_tokens_per_s)
--   steady window = first..last window with s_k within a factor (1 + $edge_share * beta) of the level;
--   reached when noise <= $max_noise, it spans >= max($min_span_share, $ramp_guard * beta / (1 + beta))
--   of the busy span (first to last window with tokens) and >= $min_in_band_share of its
--   windows are in band
--   steady_output_tokens_per_s = tokens in the steady window / steady_span_s
--   steady_requests_per_s      = ok requests finishing in it / steady_span_s
--   peak_output_tokens_per_s   = max rate_k (null when noise > $max_noise)
--   stretch: the windows from the one where the cumulative token share passes $stretch_tail to
--   the one where it reaches 1 - $stretch_tail (pipeline/steady.py re-windows a span that is
--   mostly empty over it)
--   identity, over the steps ending in the steady window with decode_tokens and a duration:
--   batch_decode_tokens_mean = mean decode_tokens per step (effective batch size),
--   iteration_ms_mean, batch_per_iteration_tokens_per_s = batch * 1000 / iteration_ms_mean,
--   busy_share = step time / steady_span_s, step_decode_tokens_per_s = decode tokens / steady_span_s
--   (= batch_per_iteration_tokens_per_s * busy_share when every step has both).
--   uncertainty of the steady rates (batch means over the steady window's m windows; rate r the
--   steady rate, d_k = rate_k - r):
--     steady_lag1_autocorrelation rho = sum_k d_k d_{k-1} / sum_k d_k^2
--     steady_output_tokens_per_s_se = sqrt(sum_k d_k^2 / (m - 1) / m * (1 + rho+) / (1 - rho+)),
--       rho+ = max(rho, 0) (AR(1) variance inflation; neighbouring windows share requests);
--       null when m < $min_interval_windows or rho > $max_lag1 (the rate drifts: no honest interval)
--     steady_output_tokens_per_s_edge = the most the rate moves when the left edge moves one window
--       (out or in) + the same for the right edge: the window was chosen from these same rates
--     steady_requests_per_s_se, _edge: the same over ok requests finishing per window
--     run_output_tokens_per_s_se: the se over all n windows of the span (their mean rate is the
--       span's tokens / d): `tracelat compare`'s SE of a steps-only run's whole-run rate (steps
--       are no independent units; ramps widen it, which errs on the safe side)
--   Token, squared-token and time sums are DECIMAL (each term rounded alone, then summed exactly), so
--   the result never depends on how threads split them or on the order of the file's records.
with g0 as (
    select coalesce($t0, t_first) as t0, coalesce($t1, t_last) as t1, throughput_source as source
    from run_summary
    where run_id = $run_id and duration_s > 0
),

g as (
    select t0, t1, source,
           least($max_windows, greatest($min_windows, ceil((t1 - t0) / $max_window_s)))::bigint as n,
           (t1 - t0) / least($max_windows, greatest($min_windows, ceil((t1 - t0) / $max_window_s))) as w
    from g0
    where t1 > t0
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
    -- the requests with token times; no list is carried here (a CTE read twice is copied).
    -- A window index: k(t) = floor((t - t0) / w), n - 1 at t1, n past it, negative before t0
    select l.req_id, ok.output_tokens, l.n_times,
           case when l.t_one >= g.t0 and l.t_end <= g.t1
                then least(g.n - 1, floor((l.t_one - g.t0) / g.w)) end::bigint as k_first,
           case when l.t_one >= g.t0 and l.t_end <= g.t1
                then least(g.n - 1, floor((l.t_end - g.t0) / g.w)) end::bigint as k_last
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
    -- few that cross a window boundary (a tenth on a 1M-step trace) or the span's ends are
    -- unnested, each time weighted N / len(token_times); x = a request's tokens in the window
    select k_first as k, output_tokens::decimal(38, 12) as tokens, (output_tokens::double ^ 2)::decimal(38, 12) as x2
    from listed where k_first = k_last
    union all
    select k, sum(weight), (sum(weight)::double ^ 2)::decimal(38, 12)
    from (
        select case when t > g.t1 then g.n else least(g.n - 1, floor((t - g.t0) / g.w)) end::bigint as k,
               req_id, weight
        from (
            select unnest(l.t_s) as t, l.req_id, (x.output_tokens / x.n_times)::decimal(38, 12) as weight
            from token_lists as l
            join listed as x on l.req_id = x.req_id
            where l.run_id = $run_id and (x.k_first is null or x.k_first <> x.k_last)
        ), g
    )
    where k >= 0 and k < (select n from g)
    group by req_id, k
),

spans as (
    select output_tokens as n_out, f, c,
           case when f > g.t1 then g.n else least(g.n - 1, floor((f - g.t0) / g.w)) end::bigint as k_f,
           case when c > g.t1 then g.n else least(g.n - 1, floor((c - g.t0) / g.w)) end::bigint as k_c
    from (
        select output_tokens, coalesce(t_first_token, t_finish) as f,
               greatest(coalesce(t_first_token, t_finish), coalesce(t_finish, t_first_token)) as c
        from ok
        where output_tokens > 0 and req_id not in (select req_id from listed)
    ), g
    where f is not null and g.source = 'requests' and c >= g.t0 and f <= g.t1
),

spread as (
    -- share of (f, c] in window k: the first and last windows are cut at f and c, so the
    -- shares of a request add up to 1 (windows outside the span are left out)
    select k, tokens, (tokens::double ^ 2)::decimal(38, 12) as x2
    from (
        select k,
               ((k = k_f)::int + case when c > f
                    then (n_out - 1) * (case when k = k_c then c else g.t0 + (k + 1) * g.w end
                                        - case when k = k_f then f else g.t0 + k * g.w end) / (c - f)
                    else (n_out - 1) * (k = k_f)::int end)::decimal(38, 12) as tokens
        from (select *, unnest(range(greatest(k_f, 0), least(k_c, g.n - 1) + 1)) as k from spans, g), g
    )
),

st as (
    -- steps by the window of their end (steps outside the span are left out); a sampled log's
    -- line stands for per_line steps (a constant of the run, so it scales the sums)
    select k,
           count(*) filter (where decode_tokens is not null and dur_ms is not null) as steps,
           sum(decode_tokens) filter (where dur_ms is not null) as decode,
           sum(dur_ms::decimal(38, 9)) filter (where decode_tokens is not null) as dur_ms,
           (sum(decode_tokens) * any_value(per_line))::decimal(38, 12) as scaled_decode,
           (sum((decode_tokens::double ^ 2)::decimal(38, 12)) * any_value(per_line))::decimal(38, 12) as x2,
           sum(dur_ms::decimal(38, 9)) * any_value(per_line)::decimal(38, 9) as scaled_dur_ms
    from (
        select least(g.n - 1, floor((t - g.t0) / g.w))::bigint as k, decode_tokens, dur_ms, per_line
        from (select coalesce(t_end, t_start) as t, decode_tokens, dur_ms
              from iterations where run_id = $run_id), g, sampling
        where t >= g.t0 and t <= g.t1
    )
    group by k
),

tok as (
    select k, sum(tokens) as tokens, sum(x2) as x2
    from (
        select k, tokens, x2 from listed_tokens
        union all
        select k, tokens, x2 from spread
        union all
        select k, scaled_decode, x2 from st where (select source from g) = 'iterations' and scaled_decode is not null
    )
    group by k
),

fin as (
    select least(g.n - 1, floor((t - g.t0) / g.w))::bigint as k, count(*) as finished
    from (select coalesce(t_finish, t_first_token, t_arrival) as t from ok), g
    where t >= g.t0 and t <= g.t1
    group by all
),

win0 as (
    select w.k, g.w, coalesce(tok.tokens, 0) as tokens, coalesce(tok.tokens, 0)::double / g.w as rate,
           coalesce(tok.x2, 0) as x2,
           coalesce(fin.finished, 0) as finished, st.steps, st.decode, st.dur_ms, st.scaled_decode, st.scaled_dur_ms
    from (select unnest(range(n)) as k from g) as w
    cross join g
    left join tok using (k)
    left join fin using (k)
    left join st using (k)
),

win as materialized (
    select *, median(rate) over (order by k rows between 1 preceding and 1 following) as s,
           sum(tokens) over (order by k) as cum
    from win0
),

runlevel as (
    select count(*) filter (where tokens > 0) as busy_windows,
           min(k) filter (where tokens > 0) as kb0,
           max(k) filter (where tokens > 0) as kb1,
           max(rate) as peak,
           sum(tokens) as tokens,
           sqrt(count(*) filter (where tokens > 0) * sum(x2)::double) / nullif(sum(tokens)::double, 0) as noise
    from win
),

stretch as (
    select min(k) filter (where cum > $stretch_tail * r.tokens) as ks0,
           min(k) filter (where cum >= (1 - $stretch_tail) * r.tokens) as ks1
    from win, runlevel as r
),

scatter as (
    -- steps are no independent units: a request's tokens come over many steps, and requests arrive
    -- at random. A steps-only run's band also takes the windows' own spread of rates, from
    -- successive differences over the busy span (robust, and a ramp's constant difference is taken
    -- out): 1.4826 * median |d_k - median(d)| / sqrt(2) / median(rate), d_k = rate_k - rate_{k-1}.
    -- Counting steps as units put a Poisson load's noise at 0.045 where its requests say 0.225:
    -- a band of 20% where the windows scatter by 20%, and no steady state. The scatter also holds
    -- any swing of the load from one window to the next, which no band should take in: it counts
    -- up to $max_scatter (a load of about 25 requests' worth of tokens a window), so a load
    -- swinging between 0.2 and 1 of its peak every few windows stays unsteady
    select 1.4826 * median(abs(d - md)) / sqrt(2) / nullif(median(rate), 0) as noise
    from (
        select d, rate, median(d) over () as md
        from (
            select win.rate - lag(win.rate) over (order by win.k) as d, win.rate
            from win, runlevel as r
            where win.k between r.kb0 and r.kb1
        )
        where d is not null
    )
),

bw as (
    select greatest($band, $noise_z * r.noise,
                    case when (select source from g) = 'iterations'
                         then $noise_z * least(coalesce(sp.noise, 0), $max_scatter) else 0 end) as beta
    from runlevel as r, scatter as sp
),

dens as (
    -- the band of each busy window's s in log space: ln(s) / ln(1 + beta) within 1 of its own
    select s, sum(tokens) over (order by ln(case when s > 0 then s end) / ln(1 + bw.beta) range between 1 preceding and 1 following) as c
    from win, bw
    where s > 0
),

mode as (
    select arg_max(s, [c, s]) as s_mode from dens
),

level as (
    select median(win.s) as m
    from win, mode, bw
    where win.s > 0 and abs(ln(case when win.s > 0 then win.s / mode.s_mode end)) <= ln(1 + bw.beta)
),

band as (
    select min(k) filter (where abs(ln(case when s > 0 then s / m end)) <= ln(1 + $edge_share * bw.beta)) as k0,
           max(k) filter (where abs(ln(case when s > 0 then s / m end)) <= ln(1 + $edge_share * bw.beta)) as k1
    from win, level, bw
    where s > 0
),

inband as (
    select count(*) filter (where abs(ln(case when s > 0 then s / m end)) <= ln(1 + bw.beta)) as in_band
    from win, band, level, bw
    where k between band.k0 and band.k1
),

held as (
    select sum(tokens) as tokens, sum(finished) as finished, sum(steps) as steps, sum(decode) as decode,
           sum(dur_ms) as dur_ms, sum(scaled_decode) as scaled_decode, sum(scaled_dur_ms) as scaled_dur_ms,
           (band.k1 - band.k0 + 1) * any_value(win.w) as span_s
    from win, band
    where win.k between band.k0 and band.k1
    group by band.k0, band.k1
),

devs as (
    -- each window's rate less its mean: over the steady window, its tokens ('tok') and its
    -- finished requests ('fin'); over the whole span, its tokens ('run')
    select 'tok' as what, win.k, win.tokens::double / win.w - held.tokens::double / held.span_s as d
    from win, band, held
    where win.k between band.k0 and band.k1
    union all
    select 'fin', win.k, win.finished / win.w - held.finished / held.span_s
    from win, band, held
    where win.k between band.k0 and band.k1
    union all
    select 'run', win.k, win.tokens::double / win.w - r.tokens::double / (g.n * g.w)
    from win, runlevel as r, g
),

spreads as (
    -- batch means: sums in window order (the same bits however threads split them), the lag-1
    -- autocorrelation rho, and the SE with the AR(1) inflation (none when rho > $max_lag1)
    select what, m, rho,
           case when coalesce(rho, 0) <= $max_lag1
                then sqrt(ss / (m - 1) / m * (1 + greatest(coalesce(rho, 0), 0)) / (1 - greatest(coalesce(rho, 0), 0)))
           end as se
    from (
        select what, count(*) as m, sum(d * d order by k) as ss, sum(d * d_prev order by k) / nullif(sum(d * d order by k), 0) as rho
        from (select what, k, d, lag(d) over (partition by what order by k) as d_prev from devs)
        group by what
    )
),

rate_se as (
    select max(m) filter (where what = 'tok') as m,
           max(rho) filter (where what = 'tok') as rho,
           max(se) filter (where what = 'tok') as se_tok,
           max(se) filter (where what = 'fin') as se_fin,
           max(se) filter (where what = 'run') as se_run
    from spreads
),

edges as (
    -- the steady rates with either edge moved by one window (out, or in), as differences from the rate
    select max(abs(x)) filter (where side = 'left') as tok_left, max(abs(x)) filter (where side = 'right') as tok_right,
           max(abs(y)) filter (where side = 'left') as fin_left, max(abs(y)) filter (where side = 'right') as fin_right
    from (
        select side,
               (held.tokens + sign * win.tokens)::double / (held.span_s + sign * win.w)
                   - held.tokens::double / held.span_s as x,
               (held.finished + sign * win.finished) / (held.span_s + sign * win.w) - held.finished / held.span_s as y
        from (
            select 'left' as side, band.k0 - 1 as k, 1 as sign from band
            union all select 'left', band.k0, -1 from band where band.k1 > band.k0
            union all select 'right', band.k1 + 1, 1 from band
            union all select 'right', band.k1, -1 from band where band.k1 > band.k0
        ) as moved
        join win using (k)
        cross join held
    )
),

verdict as (
    select band.*, held.*, inband.in_band,
           greatest($min_span_share, $ramp_guard * bw.beta / (1 + bw.beta)) as min_span,
           r.noise <= $max_noise
               and (band.k1 - band.k0 + 1) >= greatest($min_span_share, $ramp_guard * bw.beta / (1 + bw.beta))
                                               * (r.kb1 - r.kb0 + 1)
               and inband.in_band >= $min_in_band_share * (band.k1 - band.k0 + 1) as reached
    from band cross join bw cross join runlevel as r cross join inband left join held on true
)

select
    case g.source
        when 'iterations' then 'iterations'
        when 'requests' then case
            when not exists (select 1 from listed) then 'request_spans'
            when not exists (select 1 from spans) then 'token_times'
            else 'token_times+request_spans' end
    end as source,
    g.t0 as span_t0,
    g.w as window_s,
    g.n as windows,
    r.busy_windows,
    r.kb0 * g.w as busy_start_s,
    (r.kb1 + 1) * g.w as busy_end_s,
    r.kb1 - r.kb0 + 1 as busy_span_windows,
    stretch.ks0 * g.w as stretch_start_s,
    (stretch.ks1 + 1) * g.w as stretch_end_s,
    r.tokens::double as tokens,
    r.noise,
    bw.beta as band,
    v.min_span,
    level.m as level_tokens_per_s,
    case when r.noise <= $max_noise then r.peak end as peak_output_tokens_per_s,
    case when r.noise <= $max_noise then (select min(k) from win where rate = r.peak) * g.w end
        as peak_window_start_s,
    v.k0 * g.w as steady_start_s,
    (v.k1 + 1) * g.w as steady_end_s,
    v.k1 - v.k0 + 1 as steady_windows,
    v.in_band as in_band_windows,
    coalesce(v.reached, false) as reached,
    case when v.reached then v.tokens::double / v.span_s end as steady_output_tokens_per_s,
    case when v.reached and exists (select 1 from ok) then v.finished / v.span_s end as steady_requests_per_s,
    case when v.reached then v.tokens::double / nullif(r.tokens::double, 0) end as steady_token_share,
    case when v.reached then v.steps end as steps,
    case when v.reached then v.decode / nullif(v.steps, 0) end as batch_decode_tokens_mean,
    case when v.reached then v.dur_ms::double / nullif(v.steps, 0) end as iteration_ms_mean,
    case when v.reached then v.decode * 1000 / nullif(v.dur_ms::double, 0) end as batch_per_iteration_tokens_per_s,
    case when v.reached then v.scaled_dur_ms::double / 1000 / v.span_s end as busy_share,
    case when v.reached then v.scaled_decode::double / v.span_s end as step_decode_tokens_per_s,
    case when v.reached then sp.rho end as steady_lag1_autocorrelation,
    case when v.reached and sp.m >= $min_interval_windows then sp.se_tok end as steady_output_tokens_per_s_se,
    case when v.reached and sp.m >= $min_interval_windows and exists (select 1 from ok) then sp.se_fin end
        as steady_requests_per_s_se,
    case when v.reached then coalesce(e.tok_left, 0) + coalesce(e.tok_right, 0) end as steady_output_tokens_per_s_edge,
    case when v.reached and exists (select 1 from ok) then coalesce(e.fin_left, 0) + coalesce(e.fin_right, 0) end
        as steady_requests_per_s_edge,
    sp.se_run as run_output_tokens_per_s_se
from g, runlevel as r, stretch, bw, verdict as v, level, edges as e, rate_se as sp
