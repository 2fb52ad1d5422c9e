-- table:  request_latency
-- grain:  one row per (run_id, req_id)
-- inputs: requests
-- materialize: view (re-expresses each request)
-- purpose: per-request latency in ms, formulas of docs/metrics.md (pipeline/metrics.py documents them).
--   ttft_ms    = (t_first_token - t_arrival) * 1000
--   queue_ms   = (t_scheduled - t_arrival) * 1000
--   prefill_ms = (t_first_token - t_scheduled) * 1000
--   e2e_ms     = (t_finish - t_arrival) * 1000
--   tpot_ms    = (t_finish - t_first_token) * 1000 / (output_tokens - 1), only when output_tokens > 1
select
    run_id,
    req_id,
    status,
    prompt_tokens,
    output_tokens,
    cached_tokens,
    preemptions,
    t_arrival,
    t_scheduled,
    t_first_token,
    t_finish,
    (t_first_token - t_arrival) * 1000 as ttft_ms,
    (t_scheduled - t_arrival) * 1000 as queue_ms,
    (t_first_token - t_scheduled) * 1000 as prefill_ms,
    (t_finish - t_arrival) * 1000 as e2e_ms,
    case when output_tokens > 1
        then (t_finish - t_first_token) * 1000 / (output_tokens - 1)
    end as tpot_ms
from requests
