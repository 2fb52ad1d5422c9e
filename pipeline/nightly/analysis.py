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
"""

from __future__ import annotations

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


def changes(series: pl.DataFrame, nights: list[Night], settings: Settings) -> list[Change]:
    """Change points of every statistic with a direction, over ``nights``."""
    out = []
    for metric, (pos, vals) in sorted(wide(series, nights).items()):
        sign = direction(metric)
        if sign == 0:
            continue
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
    out = []
    for c in found:
        if not gating(c, min_change) or c.metric not in data:
            continue
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
