-- check:   ttft_is_queue_plus_prefill
-- grain:   one row per violating request
-- inputs:  request_latency
-- purpose: TTFT = queueing + prefill for every request with a scheduled time:
--   |ttft_ms - (queue_ms + prefill_ms)| <= 1e-6 ms, and neither part negative.
select run_id, req_id, ttft_ms, queue_ms, prefill_ms,
    case when abs(ttft_ms - (queue_ms + prefill_ms)) > 1e-6
             then 'ttft_ms ' || ttft_ms || ' != queue_ms ' || queue_ms || ' + prefill_ms ' || prefill_ms
         when queue_ms < 0 then 'queue_ms is negative: t_scheduled is before t_arrival'
         else 'prefill_ms is negative: t_scheduled is after t_first_token' end as problem
from request_latency
where run_id = $run_id and queue_ms is not null
  and (abs(ttft_ms - (queue_ms + prefill_ms)) > 1e-6 or queue_ms < 0 or prefill_ms < 0)
