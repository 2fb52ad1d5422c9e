"""Change points over the whole history, which of them are new tonight, open
regressions, the automatic baseline, and the tail cause that moved with a change.

* A change point of a statistic splits its nightly series; ``before`` and
  ``after`` are the medians of the segments on either side (bounded by that
  statistic's neighbouring change points), ``rel_change = after / before - 1``.
  It is *for the worse* when it moves the way :func:`.stats.direction` calls
  worse, and *significant* in size when ``|rel_change| >= min_change``.
* New tonight: found in the history up to tonight, and not in the history up to
  the night before within ``tolerance`` nights (one more night can move an
  estimated change by a night).  Stateless: re-running a night gives the same answer.
* Open regression: a change for the worse (at least ``min_change``) whose
  statistic has not come back: tonight's segment is still worse than the level
  before the change by more than half the change.
* Auto baseline: the most recent night before tonight, at or after the last
  change point of any statistic, that passed its SLOs; failing that, the most
  recent earlier night that passed.
* Goodput restarts: goodput statistics measure requests against the ``[goodput]``
  limits of the night's SLO file; a night whose limits differ from the nights
  before it restarts those series (:func:`goodput_restarts`): change points, open
  regressions and the baseline level of a goodput statistic use only nights with
  the same limits, since a changed definition is no change of the system.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from .changepoint import Settings, detect
from .history import Night
from .stats import direction, label


@dataclass(frozen=True)
class Change:
    """One change point of one statistic (``run_id``: the first night after it)."""

    metric: str
    run_id: str
    night: str
    index: int
    before: float
    after: float
    rel_change: float | None
    p_value: float
    worse: bool

    def to_dict(self) -> dict:
        return asdict(self)


def wide(series: pl.DataFrame, nights: list[Night]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{metric: (night positions, values)}`` for the given nights (missing values left out)."""
    pos = {n.run_id: i for i, n in enumerate(nights)}
    df = (
        series.filter(pl.col("run_id").is_in(list(pos)))
        .with_columns(pos=pl.col("run_id").replace_strict(pos, return_dtype=pl.Int64))
        .sort("pos")
    )
    out = {}
    for (metric,), g in df.group_by("metric", maintain_order=True):
        out[metric] = (g["pos"].to_numpy(), g["value"].to_numpy())
    return out


def _relative(before: float, after: float) -> float | None:
    return after / before - 1 if before else None


# statistics whose values depend on the SLO file's [goodput] limits (see goodput_restarts)
GOODPUT_PREFIX = "goodput."


def goodput_definition(night: Night) -> str | None:
    """The night's goodput definition: the per-request ``[goodput]`` limits of the SLO file it
    was recorded with, as canonical JSON.  None when there are none or they are unknown (no SLO
    file, no ``[goodput]``, a night of an older history that did not keep its SLO file): such a
    night has no goodput statistics of a known definition and never restarts the series."""
    slo = (night.options or {}).get("slo")
    if not slo:
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from ..slo import parse_slo

    try:
        spec = parse_slo(tomllib.loads(slo["text"]), slo.get("path", "slo"))
    except Exception:  # a damaged history: the definition is unknown, as for an older one
        return None
    if spec.goodput is None:
        return None
    return json.dumps(spec.goodput.limits, sort_keys=True)


def goodput_restarts(nights: list[Night]) -> list[int]:
    """Positions (in ``nights``) of the nights whose goodput limits differ from the last known
    limits before them: each starts new goodput series.  The minima (``min_attainment``) only
    judge the values, and are not part of the definition."""
    out, last = [], None
    for i, n in enumerate(nights):
        d = goodput_definition(n)
        if d is None:
            continue
        if last is not None and d != last:
            out.append(i)
        last = d
    return out


def _segments(metric: str, pos: np.ndarray, restarts: list[int]) -> list[np.ndarray]:
    """Masks over ``pos`` of the parts of ``metric``'s series compared with each other: the whole
    series, or for a goodput statistic one part per goodput definition."""
    if not metric.startswith(GOODPUT_PREFIX) or not restarts:
        return [np.ones(len(pos), dtype=bool)]
    part = np.searchsorted(np.asarray(restarts), pos, side="right")
    return [part == k for k in np.unique(part)]


def changes(series: pl.DataFrame, nights: list[Night], settings: Settings) -> list[Change]:
    """Change points of every statistic with a direction, over ``nights`` (a goodput statistic's
    within each run of nights with the same goodput limits)."""
    out = []
    restarts = goodput_restarts(nights)
    for metric, (all_pos, all_vals) in sorted(wide(series, nights).items()):
        sign = direction(metric)
        if sign == 0:
            continue
        for mask in _segments(metric, all_pos, restarts):
            out += _changes_of(metric, sign, all_pos[mask], all_vals[mask], nights, settings)
    return out


def _changes_of(
    metric: str, sign: int, pos: np.ndarray, vals: np.ndarray, nights: list[Night], settings: Settings
) -> list[Change]:
    """The change points of one comparable series of ``metric`` (``pos``: night positions)."""
    out = []
    cps = detect(vals, settings)
    bounds = [0, *(c.index for c in cps), len(vals)]
    for j, c in enumerate(cps):
        before = float(np.median(vals[bounds[j] : c.index]))
        after = float(np.median(vals[c.index : bounds[j + 2]]))
        n = nights[int(pos[c.index])]
        out.append(
            Change(
                metric,
                n.run_id,
                n.night,
                int(pos[c.index]),
                before,
                after,
                _relative(before, after),
                c.p_value,
                sign * (after - before) > 0,
            )
        )
    return out


def new_changes(now: list[Change], before: list[Change], tolerance: int = 1) -> list[Change]:
    """Changes in ``now`` with no change of the same statistic and direction in ``before`` nearby."""
    return [
        c
        for c in now
        if not any(b.metric == c.metric and b.worse == c.worse and abs(b.index - c.index) <= tolerance for b in before)
    ]


def gating(c: Change, min_change: float) -> bool:
    """A change that fails the night: for the worse and at least ``min_change`` in size (a
    change from a level of 0, e.g. no stalls before, has no relative size and always counts)."""
    return c.worse and (c.rel_change is None or abs(c.rel_change) >= min_change)


def open_regressions(found: list[Change], series: pl.DataFrame, nights: list[Night], min_change: float) -> list[dict]:
    """Changes for the worse whose statistic is still worse (see the module docstring)."""
    data = wide(series, nights)
    restarts = goodput_restarts(nights)
    out = []
    for c in found:
        if not gating(c, min_change) or c.metric not in data:
            continue
        if c.metric.startswith(GOODPUT_PREFIX) and any(r > c.index for r in restarts):
            continue  # its series restarted since (other goodput limits): tonight's level is not comparable
        later = [d for d in found if d.metric == c.metric and d.index > c.index]
        pos, vals = data[c.metric]
        start = max([c.index, *(d.index for d in later)])
        now = float(np.median(vals[pos >= start]))
        sign = direction(c.metric)
        still = sign * (now - c.before) > 0.5 * abs(c.after - c.before)
        if still:
            out.append({**c.to_dict(), "now": now, "rel_now": _relative(c.before, now), "label": label(c.metric)})
    return out


def auto_baseline(nights: list[Night], tonight: Night, found: list[Change]) -> Night | None:
    """The baseline ``--baseline auto`` picks (module docstring); None on the first night."""
    order = [n.run_id for n in nights]
    t = order.index(tonight.run_id)
    last = max([c.index for c in found if c.index <= t], default=0)
    earlier = [n for n in nights[:t] if n.passed]
    in_regime = [n for n in earlier if order.index(n.run_id) >= last]
    pick = in_regime or earlier
    return pick[-1] if pick else None


# which attribution family explains a statistic's change
_FAMILY = {"ttft_ms": "ttft", "e2e_ms": "e2e"}


def tail_cause(
    c: Change, series: pl.DataFrame, nights: list[Night], found: list[Change]
) -> tuple[str, float, float] | None:
    """The tail share that moved with ``c``: ``(metric, before, after)``, medians over the same
    segments as ``c``.  Shares add up to about 1, so when one cause grows another shrinks: for a
    change for the worse the share that grew most names the cause, for one for the better the
    share that shrank most.  None when no share moved by 5 points."""
    fam = _FAMILY.get(c.metric.split(".")[0], "tpot")
    data = wide(series, nights)
    others = sorted(d.index for d in found if d.metric == c.metric)
    lo = max([0, *(i for i in others if i < c.index)])
    hi = min([len(nights), *(i for i in others if i > c.index)])
    sign = 1 if c.worse else -1
    best = None
    for metric, (pos, vals) in sorted(data.items()):
        if not metric.startswith(f"tail.{fam}.") or metric.endswith(".unattributed"):
            continue
        a, b = vals[(pos >= lo) & (pos < c.index)], vals[(pos >= c.index) & (pos < hi)]
        if len(a) and len(b):
            ma, mb = float(np.median(a)), float(np.median(b))
            if best is None or sign * (mb - ma) > sign * (best[2] - best[1]):
                best = (metric, ma, mb)
    return best if best and sign * (best[2] - best[1]) >= 0.05 else None
