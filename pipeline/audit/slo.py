"""Moved: SLO files and goodput live in :mod:`pipeline.slo`, percentile names in :mod:`pipeline.metrics`.

This alias keeps ``pipeline.audit.slo`` imports of branches written before the move working;
new code imports from those modules.
"""

from __future__ import annotations

from ..metrics import percentile_of
from ..slo import (
    EXAMPLE,
    GOODPUT_METRICS,
    GOODPUT_MINIMA,
    PLAIN_STATS,
    SECTIONS,
    SLO_METRICS,
    FluiditySpec,
    GoodputSpec,
    SloSpec,
    StatLimit,
    load_slo,
    parse_slo,
)

__all__ = [
    "EXAMPLE",
    "GOODPUT_METRICS",
    "GOODPUT_MINIMA",
    "PLAIN_STATS",
    "SECTIONS",
    "SLO_METRICS",
    "FluiditySpec",
    "GoodputSpec",
    "SloSpec",
    "StatLimit",
    "load_slo",
    "parse_slo",
    "percentile_of",
]
