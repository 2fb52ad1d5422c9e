-- table:   perfetto_fit (read by `tracelat export` when the run has a fit; not stored)
-- grain:   one row per step of run $run in the fit
-- inputs:  iteration_fit
-- params:  $run
-- purpose: the fit's view of each step for the timeline: predicted_ms, residual_ms
--   (measured - predicted), spike_cause and is_stall (docs/model-and-attribution.md, section 4).
select iter, predicted_ms, residual_ms, spike_cause, is_stall from iteration_fit where run_id = $run
