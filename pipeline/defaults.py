"""Defaults that help text shows, in a module that imports nothing.

`tracelat fit --help` prints the stall threshold's default; taking it from
pipeline.fit.stalls would import the whole fit package (NumPy, SciPy, Polars, DuckDB)
just to show a number.
"""

from __future__ import annotations

# Stall threshold k: a step is a stall when log(measured/predicted) exceeds the median
# by k robust standard deviations (docs/model-and-attribution.md).
STALL_K = 3.5
