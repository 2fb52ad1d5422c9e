"""Putting one run's sources on one clock: the offset between a server's steps and a client's requests.

A server log (steps, unix or local wall time) and a client's request records
(``time.perf_counter``: seconds since some boot) describe the same events twice.
:func:`estimate` finds ``offset_s`` (and, on long runs, a linear ``drift``) such
that ``t_server = t_client + offset_s + drift * (t_client - pivot_s)``, from the
data alone, in three vectorised stages:

1. **coarse**: the number of requests in decode.  A step's ``decode_reqs`` equals
   the number of requests whose first token came before the step and whose last
   token after it.  On a grid of ``h`` seconds both series are cross-correlated by
   FFT over every shift that makes the two spans overlap; the shift with the least
   squared disagreement per step wins.  A sequence of batch sizes rising and
   falling with arrivals and finishes is unambiguous even at high rates.
2. **middle**: the same disagreement evaluated exactly (no bins) at the step
   midpoints on a fine grid around the coarse shift.
3. **fine**: client token times (or first-token and finish times) against step
   ends: every token leaves the server at the end of a step, so the median
   distance to the nearest step end is the remaining error (network latency
   included, which is what a client-side arrival time should carry too).  On runs
   long enough to show it, a Theil-Sen slope of those distances over time is the
   drift between the two oscillators.

Quality: ``steps_matched_share`` is the share of steps inside the client's span
whose decode count the client explains to within one request, and
``requests_matched_share`` the share of requests whose first token lies within
``tol`` of a step end; sources of different runs fail both.  No Python loop runs
over steps, requests or tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

MAX_BINS = 1 << 23  # FFT length bound: ~8M bins, a day at 10 ms
# Two sources are one run when the decode counts disagree at the found offset much less than
# at an offset drawn at random within a client span of it: mean squared disagreement at most
# this fraction of the random one.  Measured on the recordings in fixtures/: 0.003-0.53 for
# true pairs (0.53: 40 req/s, seconds of queueing, 1-second stamps), 0.63-0.80 for the
# recordings paired crosswise.
MAX_CONTRAST = 0.58


@dataclass(frozen=True)
class Steps:
    """One run's server steps on the reference clock, in time order (seconds; counts may be NaN)."""

    t_start: np.ndarray
    t_end: np.ndarray
    decode_reqs: np.ndarray
    prefill_tokens: np.ndarray
    sampled: bool = False  # the log shows only some steps (SGLang's decode_log_interval)
    decode_tokens: np.ndarray | None = None
    reconstructed: bool = False  # step times rebuilt from whole-second stamps (errors of up to a second)
    # stamped to the second, rebuilt or not (SGLang's steps end on their stamps): up to a second off
    coarse: bool = False


@dataclass(frozen=True)
class Requests:
    """One source's ok requests on its own clock (seconds); ``token_times`` flat, optional."""

    t_arrival: np.ndarray
    t_first_token: np.ndarray
    t_finish: np.ndarray
    token_times: np.ndarray | None = None
    decode_token_times: np.ndarray | None = None  # every token but each request's first


@dataclass(frozen=True)
class Alignment:
    ok: bool
    offset_s: float = 0.0
    drift: float = 0.0  # dimensionless (1e-6 = 1 ppm)
    pivot_s: float = 0.0  # client-clock time the drift turns about
    uncertainty_ms: float | None = None
    steps_matched_share: float | None = None
    requests_matched_share: float | None = None
    median_residual_ms: float | None = None
    residual_spread_ms: float | None = None
    requests: int = 0
    method: str = "estimated"
    reason: str | None = None
    notes: list[str] = field(default_factory=list)

    def apply(self, t: np.ndarray) -> np.ndarray:
        return t + self.offset_s + self.drift * (t - self.pivot_s)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in d.items()}


def decode_count(req: Requests, at: np.ndarray) -> np.ndarray:
    """Requests in decode at client times ``at``: first token at or before, last token after."""
    f = np.sort(req.t_first_token)
    e = np.sort(req.t_finish)
    return np.searchsorted(f, at, side="right") - np.searchsorted(e, at, side="right")


def _coarse(steps: Steps, req: Requests, h: float) -> float:
    """Best shift on an ``h`` grid by FFT cross-correlation of decode counts."""
    from scipy.signal import fftconvolve

    mid = (steps.t_start + steps.t_end) / 2.0
    y = np.nan_to_num(steps.decode_reqs, nan=0.0)
    s0 = mid.min()
    nb_s = int((mid.max() - s0) / h) + 1
    sb = ((mid - s0) / h).astype(np.int64)
    S = np.bincount(sb, weights=y, minlength=nb_s)
    W = np.bincount(sb, minlength=nb_s).astype(float)
    S2 = float(np.sum(y * y))
    c0 = min(req.t_first_token.min(), req.t_arrival.min())
    nb_c = int((req.t_finish.max() - c0) / h) + 2
    C = decode_count(req, c0 + (np.arange(nb_c) + 0.5) * h).astype(float)
    # error(j) = sum_b (S[b] - W[b] C[b-j])^2 over server bins, C = 0 outside the client's span
    cross = fftconvolve(S, C[::-1], mode="full")
    sq = fftconvolve(W, (C * C)[::-1], mode="full")
    err = S2 - 2.0 * cross + sq
    j = int(np.argmin(err))
    # full-mode index j pairs server bin b with client bin b - (j - (nb_c - 1))
    lag_bins = j - (nb_c - 1)
    return s0 - c0 + lag_bins * h


def _disagreement(steps: Steps, req: Requests, shifts: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """Mean squared decode-count error at the sampled steps for each shift (exact, no bins)."""
    mid = ((steps.t_start + steps.t_end) / 2.0)[sample]
    y = np.nan_to_num(steps.decode_reqs[sample], nan=0.0)
    f = np.sort(req.t_first_token)
    e = np.sort(req.t_finish)
    at = mid[None, :] - shifts[:, None]
    c = np.searchsorted(f, at, side="right") - np.searchsorted(e, at, side="right")
    return np.mean((y[None, :] - c) ** 2, axis=1)


def _by_token_counts(steps: Steps, req: Requests, shift: float, med_step: float) -> float:
    """Among shifts within three steps, the one where the client's decode tokens per step
    equal the steps' ``decode_tokens``.  Decode counts alone can settle one step off when
    requests sit out steps (preemption); tokens per step cannot: a preempted request
    emits none."""
    x = req.decode_token_times
    if x is None or len(x) < 20 or steps.decode_tokens is None or steps.sampled:
        return shift
    y = steps.decode_tokens
    if np.isfinite(y).mean() < 0.9:
        return shift
    x = np.sort(x)
    if len(x) > 200_000:  # a contiguous stretch keeps every step's count whole
        lo = int(len(x) // 2 - 100_000)
        x = x[lo : lo + 200_000]
    ends = steps.t_end
    grid = shift + np.linspace(-3 * med_step, 3 * med_step, 61)
    best, best_err = shift, np.inf
    for g in grid:  # 61 vectorised passes, not a loop over data
        k = np.searchsorted(ends, x + g - 0.5 * med_step)
        lo_k, hi_k = int(k.min()) + 1, int(k.max()) - 1
        if hi_k <= lo_k:
            continue
        cnt = np.bincount(k, minlength=len(ends))[lo_k:hi_k]
        err = float(np.mean(np.abs(cnt - np.nan_to_num(y[lo_k:hi_k]))))
        if err < best_err - 1e-12:
            best, best_err = float(g), err
    return best


def _nearest_residual(ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x`` minus the nearest of the sorted ``ends``."""
    i = np.clip(np.searchsorted(ends, x), 1, len(ends) - 1)
    left, right = ends[i - 1], ends[i]
    return np.where(x - left <= right - x, x - left, x - right)


def estimate(steps: Steps, req: Requests, seed: int = 0, drift_min_span_s: float = 600.0) -> Alignment:
    """The offset (and drift) mapping the client's clock onto the steps' (see module doc)."""
    n_req = len(req.t_first_token)
    if n_req < 3 or len(steps.t_end) < 5:
        return Alignment(
            False,
            requests=n_req,
            reason=f"too few to align ({n_req} requests, {len(steps.t_end)} steps); pass --clock-offset SOURCE=SECONDS",
        )
    rng = np.random.default_rng(seed)
    dur = steps.t_end - steps.t_start
    med_step = float(np.median(dur[dur > 0])) if np.any(dur > 0) else 0.01
    span = (steps.t_end.max() - steps.t_start.min()) + (req.t_finish.max() - req.t_arrival.min())
    h = max(med_step, 1e-3, span / MAX_BINS)
    notes: list[str] = []
    has_counts = np.isfinite(steps.decode_reqs).mean() > 0.5
    if has_counts:
        shift = _coarse(steps, req, h)
        sample = np.arange(len(steps.t_end))
        if len(sample) > 20_000:
            sample = np.sort(rng.choice(sample, 20_000, replace=False))
        grid = shift + np.linspace(-3 * h, 3 * h, 121)
        shift = float(grid[int(np.argmin(_disagreement(steps, req, grid, sample)))])
        shift = _by_token_counts(steps, req, shift, med_step)
    else:  # no decode counts: only the fine stage, from the spans' starts
        shift = float(steps.t_start.min() - req.t_arrival.min())
        notes.append("steps carry no decode counts: aligned on token times alone")
    ends = np.sort(steps.t_end)
    events = (
        req.token_times
        if req.token_times is not None and len(req.token_times)
        else np.concatenate([req.t_first_token, req.t_finish])
    )
    events = events[np.isfinite(events)]
    if len(events) > 200_000:
        events = np.sort(rng.choice(events, 200_000, replace=False))
    window = max(med_step, 1e-3)
    drift, pivot = 0.0, float(np.median(events))
    if not steps.sampled:
        for _ in range(4):
            r = _nearest_residual(ends, events + shift)
            near = np.abs(r) <= window
            if near.sum() < 3:
                break
            step = float(np.median(r[near]))
            shift -= step
            window = max(min(window, 4 * float(np.median(np.abs(r[near] - step)))), 2e-4)
            if abs(step) < 1e-7:
                break
        if events.max() - events.min() >= drift_min_span_s:
            drift = _drift(ends, events, shift, pivot, window, rng)
            if drift:
                notes.append(f"clock drift {drift * 1e6:.1f} ppm applied")
    else:
        notes.append("the server log samples steps: offset from decode counts alone (no token matching)")
    al = Alignment(True, shift, drift, pivot, requests=n_req, notes=notes)
    return _quality(al, steps, req, ends, events, med_step)


def assess(steps: Steps, req: Requests, al: Alignment) -> Alignment:
    """The quality figures of a given alignment (after the steps were re-timed, say)."""
    dur = steps.t_end - steps.t_start
    med_step = float(np.median(dur[dur > 0])) if np.any(dur > 0) else 0.01
    events = (
        req.token_times
        if req.token_times is not None and len(req.token_times)
        else np.concatenate([req.t_first_token, req.t_finish])
    )
    return _quality(al, steps, req, np.sort(steps.t_end), events[np.isfinite(events)], med_step)


def _drift(ends, events, shift, pivot, window, rng) -> float:
    """Theil-Sen slope of token-to-step residuals over time; 0 unless clearly non-zero."""
    from scipy.stats import theilslopes

    r = _nearest_residual(ends, events + shift)
    keep = np.abs(r - np.median(r)) <= window
    x, y = events[keep] - pivot, r[keep]
    if len(x) < 50:
        return 0.0
    if len(x) > 3000:
        idx = rng.choice(len(x), 3000, replace=False)
        x, y = x[idx], y[idx]
    slope, _, lo, hi = theilslopes(y, x)
    reach = abs(slope) * (x.max() - x.min()) / 2
    if lo <= 0 <= hi or reach < 2 * float(np.median(np.abs(y - np.median(y)))) + 1e-4:
        return 0.0
    return -float(slope)


def _quality(al: Alignment, steps: Steps, req: Requests, ends, events, med_step) -> Alignment:
    client_first = al.apply(req.t_first_token)
    lo, hi = al.apply(np.array([req.t_arrival.min(), req.t_finish.max()]))
    mid = (steps.t_start + steps.t_end) / 2.0
    inside = (mid >= lo) & (mid <= hi) & np.isfinite(steps.decode_reqs)
    steps_share = contrast = None
    if inside.any():
        # evaluate the client's count on its own clock: invert the (tiny) drift
        at = (mid[inside] - al.offset_s + al.drift * al.pivot_s) / (1.0 + al.drift)
        c = decode_count(req, at)
        steps_share = float(np.mean(np.abs(steps.decode_reqs[inside] - c) <= 1))
        contrast = _contrast(steps, req, al.offset_s, hi - lo)
    tol = max(0.25 * med_step, 1e-3)
    r_first = _nearest_residual(ends, client_first)
    req_share = float(np.mean(np.abs(r_first) <= tol))
    r_all = _nearest_residual(ends, al.apply(events))
    near = np.abs(r_all) <= tol
    med = float(np.median(r_all[near])) if near.any() else None
    spread = float(np.median(np.abs(r_all[near] - med))) * 1.4826 if near.sum() > 1 else None
    n_near = int(near.sum())
    if steps.sampled or n_near < 3:
        unc = med_step * 1e3 / 2
    elif steps.reconstructed:  # the steps' own times are uncertain: the residuals' spread, not its mean's
        unc = max(spread or 0.0, tol) * 1e3
    else:  # standard error of the median, but never below a tenth of a millisecond of timestamp rounding
        unc = max(1.2533 * (spread or 0.0) * 1e3 / np.sqrt(n_near), 0.1)
    ok = True
    reason = None
    if contrast is not None and contrast > MAX_CONTRAST:
        ok = False
        reason = (
            f"the sources do not look like one run: {steps_share:.0%} of the steps inside the client's "
            f"time span agree with its requests (within one request), but the disagreement at the best "
            f"offset is {contrast:.0%} of that at a random one (one run: under {MAX_CONTRAST:.0%}); "
            "check that both files come from one run, or pass --clock-offset SOURCE=SECONDS"
        )
    notes = list(al.notes) + (
        [f"decode-count disagreement {contrast:.3f} of a random offset's"] if contrast is not None else []
    )
    return Alignment(
        ok,
        al.offset_s,
        al.drift,
        al.pivot_s,
        round(unc, 3),
        steps_share,
        req_share,
        None if med is None else med * 1e3,
        None if spread is None else spread * 1e3,
        al.requests,
        al.method,
        reason,
        notes,
    )


MAX_RIVAL_RATIO = 1.5  # a rival offset whose decode-count disagreement is under this multiple of the best one's
RIVAL_REACH_S = 120.0  # rivals are sought this far each way at most (and within one client span)
RIVAL_STEP_S = 0.02  # on a grid this fine, or coarser to keep it at 2400 offsets
RIVAL_SAMPLE = 5000  # steps the disagreement is measured at


def rival(steps: Steps, req: Requests, offset: float, apart_s: float, seed: int = 0) -> tuple[float, float] | None:
    """The farthest offset more than ``apart_s`` from ``offset`` whose mean squared decode-count
    disagreement is under ``MAX_RIVAL_RATIO`` times that at ``offset`` (without one, the best
    offset that far), within one client span each way, with that ratio; None without decode counts.
    Where the batch size barely moves (a piece of a saturated run) offsets seconds apart fit about
    as well: the counts then do not pin the offset, whatever the fine stage says."""
    if np.isfinite(steps.decode_reqs).mean() <= 0.5 or len(steps.t_end) < 5:
        return None
    reach = min(float(req.t_finish.max() - req.t_arrival.min()), RIVAL_REACH_S)
    grid = offset + np.linspace(-reach, reach, int(min(2 * reach / RIVAL_STEP_S, 2400)) + 1)
    grid = np.concatenate([[offset], grid[np.abs(grid - offset) > apart_s]])
    if len(grid) < 2:
        return None
    sample = np.arange(len(steps.t_end))
    if len(sample) > RIVAL_SAMPLE:
        sample = np.sort(np.random.default_rng(seed).choice(sample, RIVAL_SAMPLE, replace=False))
    # in blocks of offsets: one block's matrix of client counts stays a few MB
    d = np.concatenate([_disagreement(steps, req, g, sample) for g in np.array_split(grid, -(-len(grid) // 200))])
    ratio = d[1:] / max(d[0], 1e-12)
    close = np.nonzero(ratio < MAX_RIVAL_RATIO)[0]
    # the farthest offset that fits nearly as well bounds how far off this one may be; without one, the best
    k = close[np.argmax(np.abs(grid[1:][close] - offset))] if len(close) else int(np.argmin(ratio))
    return float(grid[1:][k]), float(ratio[k])


def _contrast(steps: Steps, req: Requests, offset: float, span: float, n: int = 200) -> float | None:
    """Mean squared decode-count disagreement at ``offset`` over its median at random offsets within
    one client span of it (only shifts that leave at least 20 steps inside the client's span)."""
    rng = np.random.default_rng(1)
    mid = (steps.t_start + steps.t_end) / 2.0
    y = steps.decode_reqs
    lo0, hi0 = req.t_arrival.min(), req.t_finish.max()
    shifts = np.concatenate([[offset], offset + rng.uniform(-span, span, n)])
    errs = []
    for s in shifts:  # n + 1 vectorised passes
        inside = (mid >= lo0 + s) & (mid <= hi0 + s) & np.isfinite(y)
        if inside.sum() < 20:
            errs.append(np.nan)
            continue
        c = decode_count(req, mid[inside] - s)
        errs.append(float(np.mean((y[inside] - c) ** 2)))
    null = np.array(errs[1:])
    null = null[np.isfinite(null)]
    if not np.isfinite(errs[0]) or len(null) < 20 or np.median(null) <= 0:
        return None
    return float(errs[0] / np.median(null))
