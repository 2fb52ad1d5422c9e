-- table:   tail_coverage (computed on demand by `tracelat explain`; not stored)
-- grain:   one row: the requests arriving in [$t_from, $t_to]
-- inputs:  request_attribution
-- params:  $run_id, $t_from, $t_to
-- purpose: what the attribution could not split or price, for the notes under the tail:
--   n                  = requests in the window
--   no_scheduled       = of them without t_scheduled (waiting and own prefill not split)
--   unattributed_share = sum(unattributed_ttft_ms + unattributed_decode_ms) / sum(e2e_ms)
--                        (summed in req_id order: the same input gives the same bits)
--   preempt_counted    = preempted requests priced from step counts (no token times, or tokens in bursts)
--   preempt_unpriced   = preempted requests whose preemption could not be priced
--   bursty             = requests with token times in bursts and no preemption count: whether they
--                        sat out steps cannot be told (no preemption part)
select count(*) as n,
       count(*) filter (where t_scheduled is null) as no_scheduled,
       sum(unattributed_ttft_ms + unattributed_decode_ms order by req_id)
           / nullif(sum(e2e_ms order by req_id), 0) as unattributed_share,
       count(*) filter (where preemption_method = 'step_counts') as preempt_counted,
       count(*) filter (where preemptions > 0 and preemption_method = 'none') as preempt_unpriced,
       count(*) filter (where preemption_method = 'bursty') as bursty
from request_attribution
where run_id = $run_id and t_arrival between $t_from and $t_to
