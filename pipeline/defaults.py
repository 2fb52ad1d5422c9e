"""Defaults that help text shows, in a module that imports nothing.

`tracelat fit --help` prints the stall threshold's default; taking it from
pipeline.fit.stalls would import the whole fit package (NumPy, SciPy, Polars, DuckDB)
just to show a number.
"""

from __future__ import annotations

# Stall detection: the expected share of false stalls among the flagged steps (Benjamini-Hochberg
# over p-values from the run's own noise law; docs/model-and-attribution.md).
STALL_FDR = 0.05

# Deprecated fixed stall threshold k (`--k`): a step is a stall when log(measured/predicted) exceeds the median
# by k robust standard deviations (docs/model-and-attribution.md).
STALL_K = 3.5
