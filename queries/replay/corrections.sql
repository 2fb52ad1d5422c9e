-- table:   corrections (read by `tracelat replay` when it calibrates the simulator; not stored)
-- grain:   one row per run
-- inputs:  iteration_fit
-- params:  $run_id
-- purpose: two corrections of the fitted iteration model (docs/replay.md,
--   pipeline/replay/calibrate.py):
--   mean_scale  = mean(iteration_ms) / mean(predicted_ms) over fitted steps that are not stalls
--   host_gap_ms = mean(span_ms - iteration_ms) over steps that decode (the engine is busy)
--   busy_steps  = how many steps the host gap is the mean of
select
    avg(iteration_ms) filter (where not is_stall and predicted_ms is not null)
        / nullif(avg(predicted_ms) filter (where not is_stall and predicted_ms is not null), 0) as mean_scale,
    avg(span_ms - iteration_ms) filter (where decode_tokens > 0 and span_ms is not null) as host_gap_ms,
    count(*) filter (where decode_tokens > 0 and span_ms is not null) as busy_steps
from iteration_fit
where run_id = $run_id
