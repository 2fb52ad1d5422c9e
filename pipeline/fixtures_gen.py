"""Deterministic generation of the bundled demo and test traces (see fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

from .sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

# A steady chat-like load on a memory-bound decoder, then at t = 40 s a burst of
# twenty 6k-token prompts: the incident a post-mortem would look at.
INCIDENT_SPEC = WorkloadSpec(
    requests=1200, rate_rps=12.0, prompt_mean=400, prompt_sigma=0.6, output_mean=120, output_sigma=0.6,
    burst_at_s=40.0, burst_count=20, burst_prompt_tokens=6000, burst_output_tokens=40, burst_spread_s=1.0,
)
INCIDENT_POLICY = Policy(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=400_000)
INCIDENT_MODEL = IterationModel(t0_ms=6.0, a_ms_per_ctx=0.00025, b_ms_per_prefill=0.03)
INCIDENT_NOISE = NoiseModel(sigma=0.03, stall_rate=0.002, stall_ms_mean=40.0)


def make_incident(out: Path, seed: int = 7, run_id: str = "demo-incident") -> Path:
    """Write the simulated incident trace (and its truth file) to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    run_simulation(out, run_id=run_id, spec=INCIDENT_SPEC, policy=INCIDENT_POLICY, model=INCIDENT_MODEL,
                   noise=INCIDENT_NOISE, seed=seed)
    return out


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent / "fixtures" / "demo"
    print(make_incident(here / "incident.jsonl.gz"))
