"""The public result of a fit: :class:`FitResult` (what replay and reports build on)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .stalls import limit_factor


def _finite(v: Any) -> float | None:
    return None if v is None or v != v or v in (float("inf"), "inf") else float(v)


@dataclass(frozen=True)
class FitResult:
    """Memory-bound model of one run (docs/model-and-attribution.md), its stalls, hardware figures and claim checks.

    Coefficients are in ms (per token for a, b, c); a coefficient the data could not
    separate is None, and ``statements`` says why. ``ci`` holds 95%
    intervals keyed by coefficient name (``ci_method`` says how they were computed;
    ``ci_systematic_rel`` is the relative bound on the robust fit's own offset, added
    to them in quadrature). ``residual_log_sigma`` is the robust spread
    (1.4826 x MAD) of log(measured / predicted), i.e. the multiplicative noise; stalls
    are steps whose log ratio exceeds ``log_center + k * residual_log_sigma``, where
    ``k`` is what the Benjamini-Hochberg cut at false-discovery rate ``stall_fdr["q"]``
    amounts to on this run (``stall_fdr``: the cut, the fitted noise law of ordinary steps
    and the expected number of false stalls; None when a fixed k was asked for),
    ``stall_rate`` is their share of steps and ``stall_ms`` their size distribution
    (residual ms). ``stall_detection_limit_ms`` is the smallest stall the rule finds on
    the median and the p90 step (see :meth:`detection_limit_ms`).
    """

    run_id: str
    n_iterations: int
    n_fitted: int
    terms: tuple[str, ...]
    t0_ms: float | None
    a_ms_per_ctx: float | None
    b_ms_per_prefill: float | None
    c_ms_per_decode: float | None
    ci: dict[str, list[float]]
    r2: float | None
    r2_inliers: float | None
    mape_pct: float | None
    residual_log_sigma: float | None
    log_center: float
    k: float
    stall_rate: float | None
    stall_ms: dict[str, Any]
    spikes: dict[str, int]
    phases: dict[str, Any]
    shape: dict[str, Any]
    hardware: dict[str, Any] | None
    claims: list[dict[str, Any]]
    statements: list[str]
    top_spikes: list[dict[str, Any]] = field(default_factory=list)
    ci_method: str = ""
    ci_systematic_rel: float = 0.0
    stall_detection_limit_ms: dict[str, float | None] = field(default_factory=dict)
    stall_fdr: dict[str, Any] | None = None
    extended: dict[str, Any] | None = None  # pipeline.fit.extended.ExtendedFit.to_dict(); None: not fitted

    @classmethod
    def from_numbers(
        cls, run_id: str, nums: dict[str, Any], hw: dict | None, claims: list, statements: list
    ) -> "FitResult":
        """Build from the stored numeric dict (see :mod:`pipeline.fit.run`)."""
        c = nums["coef"]
        return cls(
            run_id,
            nums.get("n_iterations", nums["n"]),
            nums["n"],
            tuple(nums["terms"]),
            c.get("t0_ms"),
            c.get("a_ms_per_ctx"),
            c.get("b_ms_per_prefill"),
            c.get("c_ms_per_decode"),
            {k: list(v) for k, v in nums["ci"].items()},
            nums.get("r2"),
            nums.get("r2_inliers"),
            nums.get("mape_pct"),
            _finite(nums.get("log_scale")),
            nums["log_center"],
            nums["k"],
            nums.get("stall_rate"),
            nums.get("stall_ms", {}),
            nums.get("spikes", {}),
            nums.get("phases", {}),
            nums.get("shape", {}),
            hw,
            claims,
            statements,
            nums.get("top_spikes", []),
            nums.get("ci_method", ""),
            nums.get("ci_systematic_rel") or 0.0,
            nums.get("detection_limit_ms", {}),
            nums.get("stall_fdr"),
            nums.get("extended"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready apart from non-finite floats, which ``dumps`` turns into null)."""
        d = asdict(self)
        d["terms"] = list(self.terms)
        return d

    def predict_ms(self, context_tokens: Any, prefill_tokens: Any = 0, decode_tokens: Any = 0) -> Any:
        """Model step time in ms (scalars or numpy arrays); unfitted terms count as 0."""
        return (
            (self.t0_ms or 0.0)
            + (self.a_ms_per_ctx or 0.0) * context_tokens
            + (self.b_ms_per_prefill or 0.0) * prefill_tokens
            + (self.c_ms_per_decode or 0.0) * decode_tokens
        )

    def detection_limit_ms(self, predicted_ms: Any) -> Any:
        """Smallest stall (ms) found on a step the model puts at ``predicted_ms``, at typical noise
        (:func:`pipeline.fit.stalls.limit_factor`)."""
        return predicted_ms * limit_factor(self.log_center, self.k, self.residual_log_sigma)

    def extended_model(self):
        """The extended fit as an :class:`~pipeline.sim.model.IterationModel` (None when not fitted)."""
        from ..sim.model import IterationModel

        if not self.extended:
            return None
        c = self.extended["coef"]
        return IterationModel(**{f.name: c.get(f.name, 0.0) for f in fields(IterationModel)})

    def iteration_model(self):
        """The fit as the simulator's :class:`~pipeline.sim.model.IterationModel` (unfitted terms = 0)."""
        from ..sim.model import IterationModel

        return IterationModel(
            t0_ms=self.t0_ms or 0.0,
            a_ms_per_ctx=self.a_ms_per_ctx or 0.0,
            b_ms_per_prefill=self.b_ms_per_prefill or 0.0,
            c_ms_per_decode=self.c_ms_per_decode or 0.0,
        )

    def noise_model(self):
        """Residual noise and stalls as the simulator's :class:`~pipeline.sim.model.NoiseModel`."""
        from ..sim.model import NoiseModel

        return NoiseModel(
            sigma=self.residual_log_sigma or 0.0,
            stall_rate=self.stall_rate or 0.0,
            stall_ms_mean=self.stall_ms.get("mean") or 0.0,
        )

    def summary_section(self) -> dict[str, Any]:
        """The ``fit`` section of summary.json (``tracelat summary RUN --json``)."""
        hw = self.hardware or {}
        per_1k = lambda v: v * 1000 if v is not None else None  # noqa: E731
        return {
            "t0_ms": self.t0_ms,
            "ms_per_1k_context_tokens": per_1k(self.a_ms_per_ctx),
            "ms_per_1k_prefill_tokens": per_1k(self.b_ms_per_prefill),
            "ms_per_1k_decode_tokens": per_1k(self.c_ms_per_decode),
            "r2": self.r2,
            "r2_without_stalls": self.r2_inliers,
            "mape": self.mape_pct,
            "residual_log_sigma": self.residual_log_sigma,
            "effective_bandwidth_gbps": hw.get("effective_bandwidth_gbps"),
            "bandwidth_fraction_of_peak": hw.get("bandwidth_fraction_of_peak"),
            "weight_floor_ms": hw.get("weight_floor_ms"),
            "overhead_ms": hw.get("overhead_ms"),
            "ci": self.ci,
            "claims": [{"claim": c["claim"], "holds": c["holds"]} for c in self.claims],
            "statements": self.statements,
        }
