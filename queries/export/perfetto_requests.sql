-- table:   perfetto_requests (read by `tracelat export`; not stored)
-- grain:   one row per request of run $run with an arrival time, in arrival order (t_arrival, req_id)
-- inputs:  request_latency
-- params:  $run
-- purpose: the requests track of the Perfetto timeline: each request from arrival to its last
--   time, with its queue (arrival..scheduled), prefill (scheduled..first token) and decode
--   (first token..finish) phases, sizes and preemptions.
select req_id, t_arrival, t_scheduled, t_first_token, t_finish, prompt_tokens, output_tokens, preemptions, status
from request_latency where run_id = $run and t_arrival is not null order by t_arrival, req_id
