-- check:   steps_well_formed
-- grain:   one row per violating step
-- inputs:  iterations
-- purpose: every step ends after it starts, its duration agrees with its times (1 us), and its
--   counts are not negative.
select run_id, iter, t_start, t_end, dur_ms,
    case when t_end < t_start then 'ends before it starts'
         when abs((t_end - t_start) * 1000 - dur_ms) > 1e-3 then 'dur_ms disagrees with t_end - t_start'
         else 'a negative token or request count' end as problem
from iterations
where run_id = $run_id and (
    t_end < t_start
    or abs((t_end - t_start) * 1000 - dur_ms) > 1e-3
    or least(prefill_tokens, prefill_reqs, decode_tokens, decode_reqs, context_tokens) < 0)
