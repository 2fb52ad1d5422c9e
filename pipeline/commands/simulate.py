"""``tracelat simulate``: write a synthetic canonical trace with known ground truth."""

from __future__ import annotations

import sys

import click

from ..errors import writing
from ..terminal import echo


def _p(flag: str, default, help: str, type=None):  # noqa: A002 - mirrors click's names
    return click.option(flag, default=default, show_default=default is not None, type=type, help=help)


@click.command()
@click.option("--out", default="sim.jsonl", show_default=True, type=click.Path(dir_okay=False),
              help="Trace file to write (canonical JSON Lines; a .gz name is gzip-compressed).")
@click.option("--truth", type=click.Path(dir_okay=False),
              help="Ground-truth JSON (parameters, injected stalls). Default: <out stem>.truth.json.")
@click.option("--run-id", help="Run id written in the trace. Default: the trace file's stem.")
@_p("--requests", None, "Number of requests. Default 1000, or enough to last --iterations steps.", click.IntRange(min=1))
@_p("--rate", 10.0, "Mean arrival rate in requests per second ('inf': all at t=0).", float)
@_p("--burstiness", 1.0, "Gamma shape of inter-arrival gaps: 1 = Poisson, <1 burstier, >1 more regular.", float)
@_p("--prompt-mean", 512.0, "Mean prompt length in tokens (log-normal).", float)
@_p("--prompt-sigma", 0.8, "Log-space sigma of prompt lengths (0 = all equal).", float)
@_p("--output-mean", 128.0, "Mean output length in tokens (log-normal).", float)
@_p("--output-sigma", 0.8, "Log-space sigma of output lengths (0 = all equal).", float)
@click.option("--lengths-file", type=click.Path(exists=True, dir_okay=False),
              help="CSV/JSONL of recorded arrivals (s) and prompt/output token counts to replay instead "
                   "of synthetic ones (t_arrival|arrived_at, prompt_tokens|num_prefill_tokens|ContextTokens, "
                   "output_tokens|num_decode_tokens|GeneratedTokens).")
@_p("--iterations", None, "Stop after this many engine steps (the workload is sized to last that long).",
   click.IntRange(min=1))
@_p("--max-num-seqs", 256, "Most requests running at once (vLLM --max-num-seqs).", int)
@_p("--max-num-batched-tokens", 2048, "Token budget per step, decodes + prefill chunks (tokens).", int)
@_p("--kv-capacity-tokens", 1_000_000, "KV-cache capacity in tokens; exceeding it preempts (recompute).", int)
@_p("--kv-block-size", 1, "KV allocated in blocks of this many tokens (vLLM block_size: 16 on GPU, 128 on CPU; "
    "1 = token-granular); the cache holds kv-capacity-tokens // kv-block-size blocks.", int)
@click.option("--admit-full-prompt", is_flag=True,
              help="Admit a request only when KV has room for its whole prompt, not just its first chunk "
                   "(vLLM's scheduler_reserve_full_isl).")
@click.option("--no-chunked-prefill", is_flag=True,
              help="Do not split prompts: a prompt must fit whole in a step's token budget.")
@click.option("--prefix-caching", is_flag=True,
              help="Reuse cached prompt prefixes (vLLM enable_prefix_caching): with a --lengths-file that has "
                   "hash_ids (Mooncake) an LRU prefix cache of kv-capacity-tokens is simulated, with cached_tokens "
                   "the recorded hits are reused; the trace records each request's cached_tokens.")
@_p("--t0-ms", 5.0, "Fixed cost of one step in ms (weight read, launches, scheduling).", float)
@_p("--a-ms-per-ctx", 0.0002, "ms per context token read by attention (KV read) per step.", float)
@_p("--b-ms-per-prefill", 0.02, "ms per prompt token computed in a step.", float)
@_p("--c-ms-per-decode", 0.0, "ms per decode token generated in a step.", float)
@_p("--noise-sigma", 0.03, "Log-normal sigma of the multiplicative iteration-time noise (0 = none).", float)
@_p("--stall-rate", 0.0, "Probability that a step carries an injected stall (0..1).", float)
@_p("--stall-ms", 50.0, "Mean length of an injected stall in ms (exponential).", float)
@_p("--burst-at", None, "Inject an incident: a burst of long prompts arriving at this time (s).", float)
@_p("--burst-count", 20, "Number of requests in the burst.", int)
@_p("--burst-prompt-tokens", 8192, "Prompt length of each burst request (tokens).", int)
@_p("--burst-output-tokens", 32, "Output length of each burst request (tokens).", int)
@_p("--burst-spread", 0.0, "Spread the burst arrivals evenly over this many seconds.", float)
@_p("--seed", 0, "Random seed; the same seed and options give the same trace.", int)
@click.option("--no-token-times", is_flag=True, help="Leave out per-token times (much smaller files for long runs).")
def simulate(**o) -> None:
    """Simulate a continuous-batching LLM server (vLLM-like) and write a canonical trace.

    Decodes go first in every step, then prefill chunks fill the token budget
    FCFS; KV is held in blocks and overflow preempts the newest request (recompute). Iteration time is
    t0 + a*context + b*prefill + c*decode, times log-normal noise, plus injected
    stalls. The truth file lists every parameter and every injected stall.

    \b
    Examples:
      tracelat simulate --requests 500 --rate 8 --out run.jsonl
      tracelat simulate --iterations 1000000 --no-token-times --out big.jsonl.gz
      tracelat simulate --burst-at 60 --burst-count 30 --stall-rate 0.001
    """
    from pipeline.sim import IterationModel, NoiseModel, Policy, WorkloadSpec, run_simulation

    try:
        spec = WorkloadSpec(o["requests"], o["rate"], o["burstiness"], o["prompt_mean"], o["prompt_sigma"],
                            o["output_mean"], o["output_sigma"], o["lengths_file"], o["burst_at"],
                            o["burst_count"], o["burst_prompt_tokens"], o["burst_output_tokens"], o["burst_spread"])
        policy = Policy(o["max_num_seqs"], o["max_num_batched_tokens"], o["kv_capacity_tokens"],
                        not o["no_chunked_prefill"], o["kv_block_size"], o["admit_full_prompt"],
                        o["prefix_caching"])
        model = IterationModel(o["t0_ms"], o["a_ms_per_ctx"], o["b_ms_per_prefill"], o["c_ms_per_decode"])
        noise = NoiseModel(o["noise_sigma"], o["stall_rate"], o["stall_ms"])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    kwargs = dict(truth=o["truth"], run_id=o["run_id"], spec=spec, policy=policy, model=model, noise=noise,
                  seed=o["seed"], iterations=o["iterations"], with_token_times=not o["no_token_times"])
    try:
        if o["iterations"]:  # a known length: show a progress bar (on a terminal)
            with click.progressbar(length=o["iterations"], label="simulating", file=sys.stderr) as bar:
                with writing("--out", o["out"]):
                    run = run_simulation(o["out"], progress=lambda k: bar.update(max(k - bar.pos, 0)), **kwargs)
        else:
            with writing("--out", o["out"]):
                run = run_simulation(o["out"], **kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    echo(run.summary_line())
