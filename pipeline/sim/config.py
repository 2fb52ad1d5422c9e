"""The simulator's settings: the scheduler :class:`Policy` and the :class:`WorkloadSpec`.

Each field is declared once, with its CLI flag and help text in the field's metadata
(:func:`pipeline.settings.setting`): ``tracelat simulate`` and ``tracelat replay`` make
their options from these classes, and ``replay --sweep`` accepts their names. This module
imports no numerical library, so commands can build their options without loading one.
The classes are keyword-only: a new field cannot shift the meaning of positional values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipeline.settings import setting


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Scheduler settings (vLLM names); each field's help is in its metadata.

    ``unrecorded`` (metadata) is what a replay assumes when the recorded run does not
    say (vLLM v1's behaviour, or the simulator's for the block size); a field without it
    must be recorded or given.
    """

    max_num_seqs: int = setting(256, "Most requests running at once (vLLM --max-num-seqs).", min=1)
    max_num_batched_tokens: int = setting(
        2048,
        "Token budget per step, decodes + prefill chunks, i.e. the largest prefill chunk "
        "(vLLM --max-num-batched-tokens).",
        min=1,
    )
    kv_capacity_tokens: int = setting(
        1_000_000, "KV-cache capacity in tokens; exceeding it preempts (recompute).", min=1
    )
    chunked_prefill: bool = setting(
        True,
        "Split long prompts over steps to fit the token budget; off: a prompt must fit whole in a step's budget.",
        unrecorded=True,
    )
    kv_block_size: int = setting(
        1,
        "KV allocated in blocks of this many tokens (vLLM block_size: 16 on GPU, 128 on CPU; 1 = counted in "
        "tokens); the cache holds kv-capacity-tokens // kv-block-size blocks.",
        min=1,
        unrecorded=1,
    )
    admit_full_prompt: bool = setting(
        False,
        "Admit a request only when KV has room for its whole prompt, not just its first chunk "
        "(vLLM scheduler_reserve_full_isl); otherwise a chunked prompt admitted into a nearly full cache "
        "can preempt itself as it grows.",
        unrecorded=True,
    )
    prefix_caching: bool = setting(
        False,
        "Reuse the KV of prompt prefixes already computed (vLLM enable_prefix_caching): an admitted request "
        "prefills only the uncached part of its prompt (the requests' cached_tokens, or a workload's "
        "hash_ids in 512-token blocks through an LRU of the KV capacity); off: every prompt in full. "
        "Replay default: recorded (on when the run says so or its requests carry cached tokens).",
        unrecorded=False,
    )

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # as in vLLM: every running request must be able to decode in one step
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.kv_block_size < 1 or self.kv_block_size > self.kv_capacity_tokens:
            raise ValueError(
                f"kv_block_size must be between 1 and kv_capacity_tokens ({self.kv_capacity_tokens}), "
                f"got {self.kv_block_size}"
            )

    @property
    def kv_blocks(self) -> int:
        """Blocks in the KV cache."""
        return self.kv_capacity_tokens // self.kv_block_size

    @property
    def kv_usable_tokens(self) -> int:
        """Tokens the whole cache holds in full blocks: the most one request can use."""
        return self.kv_blocks * self.kv_block_size

    def to_dict(self) -> dict:
        """Plain-dict form, for run metadata and truth files."""
        return asdict(self)


DEFAULT_REQUESTS = 1000


# what a synthetic workload draws from; a --lengths-file workload reads these from the file
SYNTHETIC_FIELDS = ("rate_rps", "burstiness", "prompt_mean", "prompt_sigma", "output_mean", "output_sigma")
# what shapes the burst that burst_at_s injects; without burst_at_s there is none
BURST_FIELDS = ("burst_count", "burst_prompt_tokens", "burst_output_tokens", "burst_spread_s")


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """How to make the workload of a simulated run.

    Synthetic by default (gamma/Poisson arrivals, log-normal lengths; see
    :func:`pipeline.sim.poisson_workload`); ``lengths_file`` reads arrivals and sizes from a
    file instead (:func:`pipeline.sim.workload_from_file`). ``requests=None`` means
    :data:`DEFAULT_REQUESTS`, or enough to fill ``iterations`` steps when
    :func:`pipeline.sim.run_simulation` is given a step count. A burst (an incident of
    ``burst_count`` long prompts at ``burst_at_s``) is added on top when ``burst_at_s`` is set.
    """

    requests: int | None = setting(
        None, f"Number of requests. Default {DEFAULT_REQUESTS}, or enough to last --iterations steps.", min=1
    )
    rate_rps: float = setting(
        10.0, "Mean arrival rate in requests per second ('inf': all at t=0).", flag="--rate", allow_inf=True
    )
    burstiness: float = setting(1.0, "Gamma shape of inter-arrival gaps: 1 = Poisson, <1 burstier, >1 more regular.")
    prompt_mean: float = setting(512.0, "Mean prompt length in tokens (log-normal).")
    prompt_sigma: float = setting(0.8, "Log-space sigma of prompt lengths (0 = all equal).")
    output_mean: float = setting(128.0, "Mean output length in tokens (log-normal).")
    output_sigma: float = setting(0.8, "Log-space sigma of output lengths (0 = all equal).")
    lengths_file: str | None = setting(
        None,
        "CSV/JSONL of recorded arrivals (s) and prompt/output token counts to replay instead of synthetic "
        "ones (t_arrival|arrived_at, prompt_tokens|num_prefill_tokens|ContextTokens, "
        "output_tokens|num_decode_tokens|GeneratedTokens).",
        existing="file",
    )
    burst_at_s: float | None = setting(
        None, "Inject an incident: a burst of long prompts arriving at this time (s).", flag="--burst-at"
    )
    burst_count: int = setting(20, "Number of requests in the burst (with --burst-at).")
    burst_prompt_tokens: int = setting(8192, "Prompt length of each burst request (tokens; with --burst-at).")
    burst_output_tokens: int = setting(32, "Output length of each burst request (tokens; with --burst-at).")
    burst_spread_s: float = setting(
        0.0, "Spread the burst arrivals evenly over this many seconds (with --burst-at).", flag="--burst-spread"
    )

    def to_dict(self) -> dict:
        """Plain-dict form, for truth files (a lengths file's run leaves out the synthetic settings it did not use)."""
        d = asdict(self)
        if self.lengths_file:
            for name in SYNTHETIC_FIELDS:
                d.pop(name)
        return d
