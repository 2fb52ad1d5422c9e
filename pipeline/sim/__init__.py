"""Continuous-batching LLM server simulator: synthetic traces with known ground truth.

The core is :func:`pipeline.sim.engine.simulate`, a pure function of a workload,
a :class:`Policy`, an :class:`IterationModel` and a :class:`NoiseModel`. This
module adds :func:`run_simulation`, which builds a workload from a
:class:`WorkloadSpec`, simulates, and writes the canonical trace plus a truth
file; the ``simulate`` and ``demo`` commands call it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from pipeline.sim.engine import Policy, SimResult, simulate, token_times
from pipeline.sim.model import NO_NOISE, IterationModel, NoiseModel
from pipeline.sim.workload import Workload, add_burst, poisson_workload, workload_from_file

__all__ = [
    "IterationModel", "NO_NOISE", "NoiseModel", "Policy", "SimResult", "SimulationRun", "Workload", "WorkloadSpec",
    "add_burst", "build_workload", "poisson_workload", "run_simulation", "simulate", "token_times",
    "workload_from_file",
]

DEFAULT_REQUESTS = 1000


@dataclass(frozen=True)
class WorkloadSpec:
    """How to make the workload of a simulated run.

    Synthetic by default (gamma/Poisson arrivals, log-normal lengths; see
    :func:`poisson_workload`); ``lengths_file`` reads arrivals and sizes from a
    file instead (:func:`workload_from_file`). ``requests=None`` means
    :data:`DEFAULT_REQUESTS`, or enough to fill ``iterations`` steps when
    :func:`run_simulation` is given a step count. A burst (an incident of
    ``burst_count`` long prompts at ``burst_at_s``) is added on top.
    """

    requests: int | None = None
    rate_rps: float = 10.0
    burstiness: float = 1.0
    prompt_mean: float = 512.0
    prompt_sigma: float = 0.8
    output_mean: float = 128.0
    output_sigma: float = 0.8
    lengths_file: str | None = None
    burst_at_s: float | None = None
    burst_count: int = 0
    burst_prompt_tokens: int = 8192
    burst_output_tokens: int = 32
    burst_spread_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain-dict form, for truth files."""
        return asdict(self)


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
    if spec.lengths_file:
        w = workload_from_file(spec.lengths_file)
        n = n_requests if n_requests is not None else spec.requests
        if n is not None and n < len(w):
            w = w.head(n)
    else:
        n = next((x for x in (n_requests, spec.requests) if x is not None), DEFAULT_REQUESTS)
        w = poisson_workload(n, spec.rate_rps, spec.prompt_mean, spec.prompt_sigma, spec.output_mean,
                             spec.output_sigma, seed, spec.burstiness)
    if spec.burst_at_s is not None and spec.burst_count > 0:
        w = add_burst(w, spec.burst_at_s, spec.burst_count, spec.burst_prompt_tokens, spec.burst_output_tokens,
                      spec.burst_spread_s)
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
    from pipeline.sim.writer import write_trace, write_truth

    out = Path(out)
    run_id = run_id or default_truth_path(out).name.removesuffix(".truth.json")
    sized = workload is None and iterations is not None and spec.requests is None and not spec.lengths_file
    n_req = _estimate_requests(spec, policy, model, iterations) if sized else None
    for _attempt in range(6):
        w = workload if workload is not None else build_workload(spec, seed, n_req)
        result = simulate(w, policy, model, noise, seed, t_end_s=t_end_s, progress=progress,
                          max_iterations=iterations)
        if not sized or result.n_iterations >= iterations or result.info["stop"] != "done":
            break
        # the workload ran out before the step count: size it up from what one request lasted
        n_req = int(n_req * 1.3 * iterations / max(result.n_iterations, 1)) + 100
    info = {"spec": spec.to_dict() if workload is None else None, **w.describe()}
    write_trace(result, out, run_id, policy, model, noise, info, with_token_times, model_name=model_name, gpu=gpu)
    truth_path = None
    if truth is not False:
        truth_path = Path(truth) if truth else default_truth_path(out)
        write_truth(truth_path, result, run_id, policy, model, noise, seed, info, out)
    return SimulationRun(result, w, run_id, out, truth_path, seed)
