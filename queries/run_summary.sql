-- table:  run_summary
-- grain:  one row per run_id
-- inputs: runs, requests, iterations, clock_alignments
-- purpose: run-level counts, duration and throughput.
--   duration_s            = max(t_finish) - min(t_arrival) over the run's requests (the client's
--                           wall time: first request sent to last finished, as vllm bench
--                           reports it); a run without request records uses its steps,
--                           max(t_end) - min(t_start). Never a span over two sources' clocks:
--                           requests of a source whose clock alignment failed are left out of
--                           the span, the tokens and the rates when the run has others
--                           (their counts stay in requests, requests_ok).
--   output_tokens_per_s   = sum(output_tokens of ok requests) / duration_s (0 with no ok
--                           request); a run without request records, or whose ok requests do
--                           not all say their output_tokens, uses sum(decode_tokens) of its
--                           iterations over its steps' span, max(t_end) - min(t_start)
--                           (throughput_source says which): tokens and span from one source
--   busy_s                = sum of iteration durations (engine busy time), summed exactly (each
--                           dur_ms to 1e-9 ms as DECIMAL): a float sum depends on the rows' order
--   A log that samples its decode steps (SGLang writes one Decode line per
--   meta.decode_log_interval steps, meta.decode_lines_sampled) stands for that many
--   steps per line: its decode token and duration sums are scaled by the interval.
--   requests_per_s        = ok requests / duration_s
with off_clock as (
    -- request sources left on their own clock (alignment failed: files of another run?)
    select run_id, ingest_id from clock_alignments where info->>'status' = 'failed'
),

src as (
    -- spans and rates come from the requests on the steps' clock when the run has any
    select r.*, o.ingest_id is null as on_clock,
           bool_or(o.ingest_id is null) over (partition by r.run_id) as run_has_on_clock
    from requests r left join off_clock o on o.run_id = r.run_id and o.ingest_id = r.ingest_id
),

req as (
    select
        run_id,
        count(*) as requests,
        count(*) filter (where status = 'ok') as requests_ok,
        count(*) filter (where status <> 'ok') as requests_failed,
        count(*) filter (where status = 'ok' and (on_clock or not run_has_on_clock)) as requests_ok_spanned,
        sum(output_tokens) filter (where status = 'ok' and (on_clock or not run_has_on_clock)) as output_tokens,
        count(*) filter (where status = 'ok' and output_tokens is null and (on_clock or not run_has_on_clock))
            as ok_without_tokens,
        sum(prompt_tokens) filter (where status = 'ok') as prompt_tokens,
        min(t_arrival) filter (where on_clock or not run_has_on_clock) as t_first,
        max(greatest(t_finish, t_first_token, t_arrival)) filter (where on_clock or not run_has_on_clock) as t_last
    from src
    group by run_id
),

it as (
    select
        run_id,
        count(*) as iterations,
        sum(decode_tokens) * any_value(sampling.per_line) as decode_tokens,
        min(t_start) as t_first,
        max(t_end) as t_last,
        sum(dur_ms::decimal(38, 9))::double / 1000 * any_value(sampling.per_line) as busy_s
    from iterations
    left join (
        select run_id, coalesce(case when meta->>'decode_lines_sampled' = 'true'
                                     then try_cast(meta->>'decode_log_interval' as double) end, 1.0) as per_line
        from runs
    ) as sampling using (run_id)
    group by run_id
),

joined as (
    select
        runs.run_id,
        coalesce(req.requests, 0) as requests,
        coalesce(req.requests_ok, 0) as requests_ok,
        coalesce(req.requests_failed, 0) as requests_failed,
        coalesce(req.requests_ok_spanned, 0) as requests_ok_spanned,
        coalesce(it.iterations, 0) as iterations,
        case when req.ok_without_tokens = 0 then coalesce(req.output_tokens, 0) end as output_tokens,
        req.prompt_tokens,
        it.decode_tokens,
        it.busy_s,
        it.t_last - it.t_first as steps_s,
        coalesce(req.t_first, it.t_first) as t_first,
        coalesce(req.t_last, it.t_last) as t_last
    from runs
    left join req on req.run_id = runs.run_id
    left join it on it.run_id = runs.run_id
)

select
    run_id,
    requests,
    requests_ok,
    requests_failed,
    iterations,
    t_first,
    t_last,
    t_last - t_first as duration_s,
    busy_s,
    case when output_tokens is not null then output_tokens / nullif(t_last - t_first, 0)
         else decode_tokens / nullif(steps_s, 0) end as output_tokens_per_s,
    case when requests > 0 then requests_ok_spanned / nullif(t_last - t_first, 0) end as requests_per_s,
    case when output_tokens is not null then 'requests' when decode_tokens is not null then 'iterations' end
        as throughput_source
from joined
