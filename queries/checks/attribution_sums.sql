-- check:   attribution_sums
-- grain:   one row per violating request (runs with a fit only)
-- inputs:  request_attribution
-- purpose: the tail attribution's parts add up to each latency (1e-6 ms relative slack):
--   waiting_hol + waiting_capacity + waiting_step + own_prefill + unexplained_ttft + unattributed_ttft = ttft_ms
--   and with the decode parts (baseline, prefill interference, preemption, unexplained,
--   unattributed) = e2e_ms.
select run_id, req_id, ttft_ms, e2e_ms,
    'attribution parts do not add up to ' ||
    case when abs(waiting_hol_ms + waiting_capacity_ms + waiting_step_ms + own_prefill_ms + unexplained_ttft_ms
                  + unattributed_ttft_ms - ttft_ms) > 1e-6 * greatest(abs(ttft_ms), 1) then 'ttft_ms'
         else 'e2e_ms' end as problem
from request_attribution
where run_id = $run_id and (
    abs(waiting_hol_ms + waiting_capacity_ms + waiting_step_ms + own_prefill_ms + unexplained_ttft_ms + unattributed_ttft_ms
        - ttft_ms) > 1e-6 * greatest(abs(ttft_ms), 1)
    or abs(waiting_hol_ms + waiting_capacity_ms + waiting_step_ms + own_prefill_ms + unexplained_ttft_ms + unattributed_ttft_ms
           + decode_baseline_ms + prefill_interference_ms + preemption_ms + unexplained_decode_ms
           + unattributed_decode_ms - e2e_ms) > 1e-6 * greatest(abs(e2e_ms), 1))
