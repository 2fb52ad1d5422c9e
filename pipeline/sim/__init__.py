"""Continuous-batching LLM server simulator: synthetic traces with known ground truth.

The core is :func:`pipeline.sim.engine.simulate`, a pure function of a workload,
a :class:`Policy`, an :class:`IterationModel` and a :class:`NoiseModel`. This
module adds :func:`run_simulation`, which builds a workload from a
:class:`WorkloadSpec`, simulates, and writes the canonical trace plus a truth
file; the ``simulate`` and ``demo`` commands call it.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.sim.config import DEFAULT_REQUESTS, Policy, WorkloadSpec
from pipeline.sim.model import NO_NOISE, IterationModel, NoiseModel

if TYPE_CHECKING:
    from pipeline.sim.engine import SimResult, simulate, token_times
    from pipeline.sim.workload import Workload, add_burst, poisson_workload, workload_from_file

__all__ = [
    "IterationModel",
    "NO_NOISE",
    "NoiseModel",
    "Policy",
    "SimResult",
    "SimulationRun",
    "Workload",
    "WorkloadSpec",
    "add_burst",
    "build_workload",
    "poisson_workload",
    "run_simulation",
    "simulate",
    "token_times",
    "workload_from_file",
]

# The engine and workloads need NumPy; they load on first use, so that importing the settings
# (pipeline.sim.config, through this package) for a command's --help loads no numerical library.
_LAZY = {
    "SimResult": "engine",
    "simulate": "engine",
    "token_times": "engine",
    "Workload": "workload",
    "add_burst": "workload",
    "poisson_workload": "workload",
    "workload_from_file": "workload",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"pipeline.sim.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class SimulationRun:
    """What :func:`run_simulation` did: the result, the workload and the files written."""

    result: SimResult
    workload: Workload
    run_id: str
    trace_path: Path
    truth_path: Path | None
    seed: int

    def summary_line(self) -> str:
        """One line for the CLI: iterations, requests, simulated duration, path."""
        import numpy as np

        r = self.result
        ok = int(np.sum(r.requests["status"] == "ok"))
        dur = float(r.iterations["t_end"][-1]) if r.n_iterations else 0.0
        return (
            f"simulated {r.n_iterations} iterations, {r.n_requests} requests ({ok} finished) "
            f"over {dur:.1f} s of simulated time -> {self.trace_path}"
            + (f" (truth: {self.truth_path})" if self.truth_path else "")
        )


def _estimate_requests(spec: WorkloadSpec, policy: Policy, model: IterationModel, n_iter: int) -> int:
    """Requests that arrive during ``n_iter`` steps, from a steady-state estimate (with margin)."""
    P, O = spec.prompt_mean, spec.output_mean
    S, M = policy.max_num_seqs, policy.max_num_batched_tokens
    if math.isinf(spec.rate_rps):  # all at t = 0: enough to keep a full batch busy
        return int(1.3 * n_iter * S / O) + 100
    x = model.t0_ms  # iteration time in ms, solved by damped fixed-point iteration
    for _ in range(200):
        per_step = spec.rate_rps * x / 1000.0
        conc = min(per_step * O, S, policy.kv_capacity_tokens / (P + O / 2))
        prefill = min(per_step * P, max(M - conc, 0))
        x_new = model.base_ms(conc * (P + O / 2), prefill, conc)
        x = 0.5 * (x + x_new)
    return int(1.5 * spec.rate_rps * n_iter * x / 1000.0) + 100


def build_workload(spec: WorkloadSpec, seed: int, n_requests: int | None = None) -> Workload:
    """The workload ``spec`` describes (``n_requests`` overrides ``spec.requests``)."""
    from pipeline.sim.workload import add_burst, poisson_workload, workload_from_file

    if spec.lengths_file:
        w = workload_from_file(spec.lengths_file)
        n = n_requests if n_requests is not None else spec.requests
        if n is not None and n < len(w):
            w = w.head(n)
    else:
        n = next((x for x in (n_requests, spec.requests) if x is not None), DEFAULT_REQUESTS)
        w = poisson_workload(
            n,
            spec.rate_rps,
            spec.prompt_mean,
            spec.prompt_sigma,
            spec.output_mean,
            spec.output_sigma,
            seed,
            spec.burstiness,
        )
    if spec.burst_at_s is not None and spec.burst_count > 0:
        w = add_burst(
            w,
            spec.burst_at_s,
            spec.burst_count,
            spec.burst_prompt_tokens,
            spec.burst_output_tokens,
            spec.burst_spread_s,
        )
    return w


def split_trace_name(name: str) -> tuple[str, str]:
    """``("sim", ".jsonl.gz")`` for ``sim.jsonl.gz``: a trace file's stem and its format suffixes."""
    stem, suffix = name, ""
    for ext in (".gz", ".jsonl", ".ndjson", ".json"):
        if stem.endswith(ext):
            stem, suffix = stem[: -len(ext)], ext + suffix
    return stem, suffix


def default_truth_path(out) -> Path:
    """``<out stem>.truth.json`` next to the trace (``sim.jsonl.gz`` -> ``sim.truth.json``)."""
    out = Path(out)
    return out.with_name(f"{split_trace_name(out.name)[0]}.truth.json")


def run_simulation(
    out="sim.jsonl",
    *,
    truth=None,
    run_id: str | None = None,
    spec: WorkloadSpec = WorkloadSpec(),
    workload: Workload | None = None,
    policy: Policy = Policy(),
    model: IterationModel = IterationModel(),
    noise: NoiseModel = NoiseModel(),
    seed: int = 0,
    iterations: int | None = None,
    t_end_s: float | None = None,
    with_token_times: bool = True,
    progress: Callable[[int], None] | None = None,
    model_name: str = "simulated",
    gpu: str = "simulated",
) -> SimulationRun:
    """Simulate and write the canonical trace at ``out`` and the truth file.

    Args:
        out: trace path (``.gz`` for gzip).
        truth: truth-file path; ``None`` for :func:`default_truth_path`, ``False`` for none.
        run_id: defaults to the trace file's stem.
        spec: workload description, ignored when ``workload`` is given.
        workload: an explicit workload.
        policy, model, noise, seed: see :func:`pipeline.sim.engine.simulate`.
        iterations: stop after this many steps; a synthetic workload without an
            explicit request count is sized to last that long.
        t_end_s: stop at this simulated time.
        with_token_times: write per-token times in the request records.
        progress: called with the number of steps done so far.
        model_name, gpu: what the run record names (e.g. a catalogued model and GPU,
            so that bandwidth figures can be checked against the simulated truth).
    """
    from pipeline.sim.engine import simulate
    from pipeline.sim.writer import write_trace, write_truth

    out = Path(out)
    run_id = run_id or default_truth_path(out).name.removesuffix(".truth.json")
    sized = workload is None and iterations is not None and spec.requests is None and not spec.lengths_file
    n_req = _estimate_requests(spec, policy, model, iterations) if sized else None
    for _attempt in range(6):
        w = workload if workload is not None else build_workload(spec, seed, n_req)
        result = simulate(
            w,
            policy=policy,
            model=model,
            noise=noise,
            seed=seed,
            t_end_s=t_end_s,
            progress=progress,
            max_iterations=iterations,
        )
        if not sized or result.n_iterations >= iterations or result.info["stop"] != "done":
            break
        # the workload ran out before the step count: size it up from what one request lasted
        n_req = int(n_req * 1.3 * iterations / max(result.n_iterations, 1)) + 100
    info = {"spec": spec.to_dict() if workload is None else None, **w.describe()}
    write_trace(
        result,
        out,
        run_id,
        policy=policy,
        model=model,
        noise=noise,
        workload_info=info,
        with_token_times=with_token_times,
        model_name=model_name,
        gpu=gpu,
    )
    truth_path = None
    if truth is not False:
        truth_path = Path(truth) if truth else default_truth_path(out)
        write_truth(
            truth_path,
            result,
            run_id,
            policy=policy,
            model=model,
            noise=noise,
            seed=seed,
            workload_info=info,
            trace_path=out,
        )
    return SimulationRun(result, w, run_id, out, truth_path, seed)
