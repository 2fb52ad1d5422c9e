"""Memory-bound model fit, stall detection and tail attribution (docs/model-and-attribution.md).

Public API (what reports and replay build on)::

    from pipeline.fit import get_or_fit, fit_run, explain
    fit = get_or_fit(con, run_id)              # stored fit, or a new one
    fit.t0_ms, fit.a_ms_per_ctx, fit.b_ms_per_prefill, fit.c_ms_per_decode, fit.ci
    fit.iteration_model(), fit.noise_model()   # as the simulator's models
    explain(con, run_id, "ttft")               # which parts grow in the p99 tail

Tables written to the store (per run, replaced on every fit): ``fits`` (the
numbers as JSON), ``iteration_fit`` (model parts of every step) and
``request_attribution`` (parts of every request). See docs/model-and-attribution.md.
"""

from __future__ import annotations

from .attribution import explain, parse_time, tail_section
from .result import FitResult
from .run import fit_ready, fit_run, get_or_fit

__all__ = ["FitResult", "explain", "fit_ready", "fit_run", "get_or_fit", "parse_time", "tail_section"]
