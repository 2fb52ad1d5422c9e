"""Iteration-time and noise models used by the simulator.

The iteration-time model is the memory-bound model (docs/model-and-attribution.md)::

    base_ms      = t0_ms + a_ms_per_ctx * context_tokens
                         + b_ms_per_prefill * prefill_tokens
                         + c_ms_per_decode * decode_tokens
    iteration_ms = base_ms * noise_factor + stall_ms

``noise_factor = exp(N(0, sigma) - sigma**2 / 2)`` has mean 1, so noise does not
shift the mean iteration time. ``stall_ms`` is 0 for most iterations; with
probability ``stall_rate`` an iteration carries an injected stall (a GC pause, a
host hiccup) whose length is drawn from an exponential distribution with mean
``stall_ms_mean``.

With ``law="t"`` the log noise is Student-t with ``df`` degrees of freedom, scaled to
standard deviation ``sigma`` (df > 2), with the same ``-sigma**2 / 2`` shift: heavy-tailed
host variance, whose exponential moment does not exist, so the factor's bulk (not its
mean) matches the log-normal's. Stall detectors must not mistake its tail for stalls.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pipeline.settings import setting

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, kw_only=True)
class IterationModel:
    """Linear iteration-time model; every coefficient is in milliseconds (help in each field's metadata).

    ``d_ms_per_req`` and ``e_ms_per_prefill_attn`` are the extended terms: 0 is the
    memory-bound model.
    """

    t0_ms: float = setting(5.0, "Fixed cost of one step in ms (weight read, launches, scheduling).", min=0)
    a_ms_per_ctx: float = setting(0.0002, "ms per context token read by attention (KV read) per step.", min=0)
    b_ms_per_prefill: float = setting(0.02, "ms per prompt token computed in a step.", min=0)
    c_ms_per_decode: float = setting(0.0, "ms per decode token generated in a step.", min=0)
    d_ms_per_req: float = setting(
        0.0,
        "ms per request in a step (decodes + prefill chunks): per-sequence host and kernel work "
        "(0: the memory-bound model).",
        min=0,
    )
    e_ms_per_prefill_attn: float = setting(
        0.0,
        "ms per attention token pair of a prefill chunk: a chunk of L tokens after c computed ones "
        "attends to L x (c + L/2) pairs (0: the memory-bound model).",
        min=0,
    )

    def base_ms(self, context_tokens, prefill_tokens, decode_tokens, requests=0, prefill_attn=0):
        """Model time before noise and stalls; works on scalars and numpy arrays."""
        return (
            self.t0_ms
            + self.a_ms_per_ctx * context_tokens
            + self.b_ms_per_prefill * prefill_tokens
            + self.c_ms_per_decode * decode_tokens
            + self.d_ms_per_req * requests
            + self.e_ms_per_prefill_attn * prefill_attn
        )

    @property
    def extended(self) -> bool:
        """Whether a term beyond the memory-bound model costs anything."""
        return bool(self.d_ms_per_req or self.e_ms_per_prefill_attn)

    def to_dict(self) -> dict:
        """Plain-dict form, for truth files and run metadata (extended terms only when used, so
        existing traces keep their bytes)."""
        d = asdict(self)
        for k in ("d_ms_per_req", "e_ms_per_prefill_attn"):
            if not d[k]:
                del d[k]
        return d


@dataclass(frozen=True, kw_only=True)
class NoiseModel:
    """Multiplicative log noise plus rare additive stalls (help in each field's metadata)."""

    sigma: float = setting(
        0.03, "Log-space sigma of the multiplicative iteration-time noise (0 = none).", flag="--noise-sigma"
    )
    stall_rate: float = setting(0.0, "Probability that a step carries an injected stall (0..1).")
    stall_ms_mean: float = setting(
        50.0, "Mean length of an injected stall in ms (exponential; with --stall-rate above 0).", flag="--stall-ms"
    )
    law: str = setting(
        "lognormal",
        "Law of the log noise: lognormal (Gaussian) or t (Student-t, heavy-tailed, "
        "scaled to standard deviation sigma).",
        flag="--noise-law",
        choices=("lognormal", "t"),
    )
    df: float = setting(
        3.0,
        "Degrees of freedom of the t law (> 2, so that sigma is its standard deviation; with --noise-law t).",
        flag="--noise-df",
    )

    def __post_init__(self) -> None:
        if self.sigma < 0:
            raise ValueError(f"noise sigma must be >= 0, got {self.sigma}")
        if not 0.0 <= self.stall_rate <= 1.0:
            raise ValueError(f"stall_rate must be in [0, 1], got {self.stall_rate}")
        if self.stall_ms_mean < 0:
            raise ValueError(f"stall_ms_mean must be >= 0, got {self.stall_ms_mean}")
        if self.law not in ("lognormal", "t"):
            raise ValueError(f"noise law must be 'lognormal' or 't', got {self.law!r}")
        if self.law == "t" and not self.df > 2:
            raise ValueError(f"the t law needs df > 2 (a finite standard deviation), got {self.df}")

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` noise factors and ``n`` stall lengths (ms, 0 where no stall).

        The number and order of draws is fixed per call for a law, so a run is
        reproducible for a seed whatever the parameters are (the t law draws its
        chi-square last: a log-normal run is the same draws as before the law existed).
        """
        import numpy as np  # here, not at the top: commands read the fields without loading NumPy

        z = rng.standard_normal(n)
        u = rng.random(n)
        e = rng.standard_exponential(n)
        if self.law == "t":  # t = z / sqrt(chi2_df / df), rescaled to unit standard deviation
            z = z / np.sqrt(rng.chisquare(self.df, n) / self.df) * np.sqrt((self.df - 2) / self.df)
        factor = np.exp(z * self.sigma - 0.5 * self.sigma * self.sigma)
        stall = np.where(u < self.stall_rate, e * self.stall_ms_mean, 0.0)
        return factor, stall

    def to_dict(self) -> dict:
        """Plain-dict form, for truth files and run metadata (the law only when it is not log-normal,
        so existing traces keep their bytes)."""
        d = asdict(self)
        if self.law == "lognormal":
            del d["law"], d["df"]
        return d


# no spread and no stalls (so no stall size either: a replay's header and JSON describe no stall)
NO_NOISE = NoiseModel(sigma=0.0, stall_rate=0.0, stall_ms_mean=0.0)
