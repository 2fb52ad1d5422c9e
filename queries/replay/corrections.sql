-- table:   corrections (read by `tracelat replay` when it calibrates the simulator; not stored)
-- grain:   one row per run
-- inputs:  iteration_fit
-- params:  $run_id
-- purpose: two corrections of the fitted iteration model (docs/replay.md,
--   pipeline/replay/calibrate.py):
--   mean_scale  = mean(iteration_ms) / mean(predicted_ms) over fitted steps that are not stalls
--   host_gap_ms = mean(span_ms - iteration_ms) over steps that decode (the engine is busy)
--   busy_steps  = how many steps the host gap is the mean of
--   The means are of fixed-point numbers (18 decimals), summed exactly: a float sum depends on
--   the order of its terms, which threads scanning a run's row groups in parallel do not fix,
--   and the same store then gave replays that differed in the last bits.
select
    avg(iteration_ms::decimal(38, 18)) filter (where not is_stall and isfinite(predicted_ms))
        / nullif(avg(predicted_ms::decimal(38, 18)) filter (where not is_stall and isfinite(predicted_ms)), 0)
        as mean_scale,
    avg((span_ms - iteration_ms)::decimal(38, 18)) filter (where decode_tokens > 0 and isfinite(span_ms))
        as host_gap_ms,
    count(*) filter (where decode_tokens > 0 and isfinite(span_ms)) as busy_steps
from iteration_fit
where run_id = $run_id
