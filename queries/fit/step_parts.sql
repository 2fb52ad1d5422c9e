-- table:   step_parts (read by pipeline/fit, which adds running sums in Polars; not stored)
-- grain:   one row per (run_id, iter) of the fitted run with an end time and a span
-- inputs:  iteration_fit
-- params:  $run_id
-- purpose: every step's span split into the parts request attribution prices (docs/model-and-attribution.md, section 5):
--   base_ms = decode_baseline_ms, pf_ms = prefill_ms_part,
--   ux_ms   = residual_ms + host_gap_ms (unexplained), ua_ms = span_ms when the step has
--   no prediction (unattributed); base + pf + ux + ua = span_ms.
--   pipeline/fit/sql.py turns these into `fit_step_sums` (running sums in step order, the
--   next step's parts, and a row at -infinity) for queries/fit/request_attribution.sql.
select
    t_end,
    iter,
    span_ms,
    case when predicted_ms is null then 0 else decode_baseline_ms end as base_ms,
    case when predicted_ms is null then 0 else prefill_ms_part end as pf_ms,
    case when predicted_ms is null then 0 else residual_ms + host_gap_ms end as ux_ms,
    case when predicted_ms is null then span_ms else 0 end as ua_ms
from iteration_fit
where run_id = $run_id and t_end is not null and span_ms is not null
