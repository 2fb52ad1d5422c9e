"""Deterministic generation of the bundled demo and test traces (see fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

from .sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

# A steady chat-like load on Llama-3.1-8B (bf16) on one H100 SXM, then at t = 40 s a
# burst of twenty 6k-token prompts: the incident a post-mortem would look at.
# The model's numbers follow the hardware: KV bytes per token 2*32*8*128*2 = 131072,
# read at 80% of 3.35 TB/s -> a = 4.89e-5 ms per context token; weights 16.06 GB at
# 3.35 TB/s = 4.79 ms, plus 1.2 ms per-step overhead -> t0 = 6.0 ms; prefill
# 2 * 8.03e9 FLOP per token at 50% of 989 TFLOP/s -> b = 0.0325 ms per token.
INCIDENT_SPEC = WorkloadSpec(
    requests=1200,
    rate_rps=12.0,
    prompt_mean=400,
    prompt_sigma=0.6,
    output_mean=120,
    output_sigma=0.6,
    burst_at_s=40.0,
    burst_count=20,
    burst_prompt_tokens=6000,
    burst_output_tokens=40,
    burst_spread_s=1.0,
)
INCIDENT_POLICY = Policy(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=400_000)
INCIDENT_MODEL = IterationModel(t0_ms=6.0, a_ms_per_ctx=4.89e-5, b_ms_per_prefill=0.0325)
INCIDENT_MODEL_NAME = "llama-3.1-8b"
INCIDENT_GPU = "h100-sxm"
INCIDENT_NOISE = NoiseModel(sigma=0.03, stall_rate=0.002, stall_ms_mean=40.0)


def make_incident(out: Path, seed: int = 7, run_id: str = "demo-incident") -> Path:
    """Write the simulated incident trace (and its truth file) to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    run_simulation(
        out,
        run_id=run_id,
        spec=INCIDENT_SPEC,
        policy=INCIDENT_POLICY,
        model=INCIDENT_MODEL,
        noise=INCIDENT_NOISE,
        seed=seed,
        model_name=INCIDENT_MODEL_NAME,
        gpu=INCIDENT_GPU,
    )
    return out


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent / "fixtures" / "demo"
    print(make_incident(here / "incident.jsonl.gz"))
