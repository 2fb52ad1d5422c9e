"""An extended step-time model, chosen by out-of-sample error (issue 13, part 2).

The memory-bound model ``t0 + a*context + b*prefill (+ c*decode)`` stays the interpretable
core; real engines add costs it does not have. Candidate terms:

- ``d_ms_per_req`` x requests in the step (decodes + prefill chunks, ``batch_reqs``):
  per-sequence host and kernel work (sampling, bookkeeping, launches that grow with the batch).
  Where every decode request emits one token (no speculative decoding), decode tokens and
  decode requests are the same count, so once d is in, c is only kept if it still helps.
- ``e_ms_per_prefill_attn`` x prefill attention pairs: a prefill chunk of L tokens after c
  computed ones attends to ``L x (c + L / 2)`` token pairs. Exact when the trace records
  the field ``prefill_attn`` (the simulator writes it); an engine log has no per-chunk
  context, so there it is approximated as ``prefill_tokens^2 / (2 x prefill_reqs)`` (chunks of
  equal length, attending over themselves only), and the statements say so.

Why these choices:

- **Non-negative costs** (t0 too): a cost below zero is a term absorbing another's error; it
  extrapolates badly in what-ifs. Each pass solves the non-negative least-squares problem
  exactly (``scipy.optimize.nnls`` on the Cholesky factor of the p x p normal matrix: the
  same minimiser as on the n x p rows, at O(n p^2) per pass).
- **Relative, robust residuals**, as the memory-bound fit: rows divided by the previous
  prediction, soft_l1 weights (iteratively re-weighted to convergence), so stalls do not drag it.
- **Terms by cross-validation on contiguous time blocks** (5 blocks, each held out in turn):
  neighbouring steps share batch composition and host state, so random held-out rows would
  reward a model that memorises a period. A candidate is added when it lowers the held-out
  MAPE by at least 1% (relative); c is dropped, or replaced by d, when that does not raise it
  by more than 0.2% (the simpler or more general term wins a tie).
- Reported for both models, on held-out steps: MAPE (%) and the p90 of the absolute error
  (ms). ``better`` says whether the extended model predicts held-out steps better (held-out
  MAPE lower by 1% or more); replay uses it only then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize

BASE_COLUMNS = {
    "t0_ms": None,
    "a_ms_per_ctx": "context_tokens",
    "b_ms_per_prefill": "prefill_tokens",
    "c_ms_per_decode": "decode_tokens",
}
CANDIDATES = {"d_ms_per_req": "batch_reqs", "e_ms_per_prefill_attn": "prefill_attn"}
CV_BLOCKS = 5
CV_MAX_STEPS = 50_000  # above this the CV fits use every k-th step of each block (the final fit uses all)
ADD_GAIN = 0.01  # a candidate must lower the held-out MAPE by 1% (relative) to be added
DROP_SLACK = 0.002  # c is dropped when that raises the held-out MAPE by at most 0.2%
MIN_VARYING = 5
IRLS_MAX_PASSES = 50
IRLS_TOL = 1e-6  # relative change of the (column-scaled) coefficients at which the re-weighting stops


@dataclass(frozen=True)
class ExtendedFit:
    """The extended model: coefficients (ms per unit), the terms chosen, and both models'
    held-out errors. ``mean_scale``: mean measured / mean predicted over non-stall steps (replay)."""

    terms: tuple[str, ...]
    coef: dict[str, float]
    cv: dict[str, dict[str, float]]
    better: bool
    mean_scale: float
    prefill_attn_source: str | None
    statements: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "coef": dict(self.coef),
            "cv": {k: dict(v) for k, v in self.cv.items()},
            "better": self.better,
            "mean_scale": self.mean_scale,
            "prefill_attn_source": self.prefill_attn_source,
            "statements": list(self.statements),
        }


def features(
    cols: dict[str, np.ndarray], extra: dict[str, np.ndarray | None]
) -> tuple[dict[str, np.ndarray], str | None, list[str]]:
    """The candidate columns these data can give, where the prefill-attention column came from, notes."""
    out, notes, source = {}, [], None
    reqs = extra.get("batch_reqs")
    if reqs is not None and np.isfinite(reqs).all():
        out["batch_reqs"] = reqs
    else:
        notes.append("requests per step are not recorded: d_ms_per_req (per-request cost) is not a candidate")
    attn = extra.get("prefill_attn")
    pf, npf = cols.get("prefill_tokens"), extra.get("prefill_reqs")
    if attn is not None and np.isfinite(attn).all():
        out["prefill_attn"], source = attn, "recorded (prefill_attn)"
    elif pf is not None and npf is not None and np.isfinite(npf).all():
        out["prefill_attn"] = pf * pf / (2 * np.maximum(npf, 1))
        source = "approximated as prefill_tokens^2 / (2 prefill_reqs): chunks attend over themselves only"
    else:
        notes.append("prefill tokens or requests are not recorded: e_ms_per_prefill_attn is not a candidate")
    for col in list(out):
        x = out[col]
        if np.count_nonzero(x != np.median(x)) < MIN_VARYING:
            notes.append(f"{col} (almost) never varies: its term cannot be told apart from t0")
            del out[col]
    return out, source, notes


def _nnls_rows(A: np.ndarray, t: np.ndarray) -> np.ndarray:
    """argmin ||A b - t|| with b >= 0, through the p x p Cholesky factor of A^T A."""
    G = A.T @ A
    g = A.T @ t
    try:
        R = np.linalg.cholesky(G + np.eye(len(G)) * 1e-12 * np.trace(G)).T
    except np.linalg.LinAlgError:
        return optimize.nnls(A, t)[0]
    # ||A b - t||^2 = ||R b - R^-T g||^2 + const
    return optimize.nnls(R, np.linalg.solve(R.T, g))[0]


def fit_nonneg(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Robust relative-error fit with non-negative coefficients (columns of X, intercept included)."""
    colscale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    Xs = X / colscale
    beta = _nnls_rows(Xs, y)
    floor = 0.05 * max(float(np.median(y)), 1e-9)
    for _ in range(IRLS_MAX_PASSES):
        s = np.maximum(Xs @ beta, floor)
        A, t = Xs / s[:, None], y / s
        r = A @ beta - t
        f = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-9)
        w = (1.0 + (r / f) ** 2) ** -0.25  # square root of the soft_l1 IRLS weight
        new = _nnls_rows(A * w[:, None], t * w)
        # to convergence, not a fixed count: on heavy-tailed real steps a fixed count left the held-out
        # MAPE depending on where it stopped (56.8% after 6 passes, 60.5% after 4 on fixtures/vllm_queue)
        done = np.max(np.abs(new - beta)) <= IRLS_TOL * max(float(np.max(np.abs(new))), 1e-300)
        beta = new
        if done:
            break
    return beta / colscale


def _design(terms: tuple[str, ...], cols: dict[str, np.ndarray], n: int) -> np.ndarray:
    return np.column_stack([np.ones(n)] + [cols[BASE_COLUMNS.get(t) or CANDIDATES[t]] for t in terms])


def _errors(y: np.ndarray, yhat: np.ndarray) -> dict[str, float]:
    ok = y > 0
    return {
        "mape_pct": float(np.mean(np.abs(y[ok] - yhat[ok]) / y[ok]) * 100),
        "p90_abs_ms": float(np.quantile(np.abs(y - yhat), 0.9)),
    }


def cross_validate(terms: tuple[str, ...], cols: dict[str, np.ndarray], y: np.ndarray) -> dict[str, float]:
    """Held-out errors: each of 5 contiguous time blocks predicted by a fit to the other four."""
    n = len(y)
    stride = max(1, n // CV_MAX_STEPS)
    X = _design(terms, cols, n)
    yhat = np.empty(n)
    for block in np.array_split(np.arange(n), CV_BLOCKS):
        train = np.ones(n, dtype=bool)
        train[block] = False
        idx = np.flatnonzero(train)[::stride]
        yhat[block] = X[block] @ fit_nonneg(X[idx], y[idx])
    return _errors(y, yhat)


def fit_extended(
    cols: dict[str, np.ndarray],
    extra: dict[str, np.ndarray | None],
    y: np.ndarray,
    base_terms: tuple[str, ...],
    inlier: np.ndarray,
) -> ExtendedFit | None:
    """Choose the extended model's terms by held-out error and fit it (rows in time order).

    ``cols``: the memory-bound columns; ``extra``: ``batch_reqs``, ``prefill_reqs``,
    ``decode_reqs`` and ``prefill_attn`` (None or NaN where not recorded); ``base_terms``: the
    memory-bound terms the data separate; ``inlier``: steps that are not stalls (for ``mean_scale``).
    None when there are too few steps for five blocks.
    """
    n = len(y)
    if n < CV_BLOCKS * 20:
        return None
    cand, source, notes = features(cols, extra)
    allc = dict(cols) | cand
    base = tuple(base_terms)
    scores = {base: cross_validate(base, allc, y)}
    current = base
    while True:
        moves = [current + (t,) for t in CANDIDATES if CANDIDATES[t] in cand and t not in current]
        if "c_ms_per_decode" in current:
            without_c = tuple(t for t in current if t != "c_ms_per_decode")
            if "d_ms_per_req" in current:
                moves.append(without_c)
            elif "batch_reqs" in cand:  # a per-request cost is a per-decode-token cost that prefill chunks pay too
                moves.append(without_c + ("d_ms_per_req",))
        for m in moves:
            if m not in scores:
                scores[m] = cross_validate(m, allc, y)
        cur = scores[current]["mape_pct"]
        ok = [
            m
            for m in moves
            if scores[m]["mape_pct"] <= cur * (1 + DROP_SLACK if len(m) <= len(current) else 1 - ADD_GAIN)
        ]
        if not ok:
            break
        current = min(ok, key=lambda m: scores[m]["mape_pct"])
    beta = fit_nonneg(_design(current, allc, n), y)
    coef = dict(zip(("t0_ms",) + current, map(float, beta)))
    yhat = _design(current, allc, n) @ beta
    sel = inlier & (yhat > 0)
    scale = float(y[sel].mean() / yhat[sel].mean()) if sel.any() else 1.0
    mb, ext = scores[base], scores[current]
    # a tie (c swapped for d on a memory-bound run) is not "better": replay switches models on a real gain only
    better = current != base and ext["mape_pct"] <= mb["mape_pct"] * (1 - ADD_GAIN)
    added = [t for t in current if t not in base]
    dropped = [t for t in base if t not in current]
    if added or dropped:
        notes.append(
            f"held-out steps (5 contiguous time blocks) choose {', '.join('+' + t for t in added)}"
            + (f", {', '.join('-' + t for t in dropped)}" if dropped else "")
            + f": MAPE {mb['mape_pct']:.3g}% -> {ext['mape_pct']:.3g}%, p90 |error| "
            f"{mb['p90_abs_ms']:.3g} -> {ext['p90_abs_ms']:.3g} ms"
        )
    else:
        notes.append(
            f"no candidate term lowers the held-out MAPE ({mb['mape_pct']:.3g}%) by 1%: the memory-bound model stands"
        )
    if "e_ms_per_prefill_attn" in current and source and source.startswith("approximated"):
        notes.append(f"prefill attention {source}")
    return ExtendedFit(
        current,
        coef,
        {"memory_bound": mb, "extended": ext},
        better,
        scale,
        source if "e_ms_per_prefill_attn" in current else None,
        notes,
    )
