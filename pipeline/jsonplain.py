"""Plain JSON values from what the pipeline computes (numpy scalars, paths, NaN)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def plain(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers, paths as strings and NaN/inf as None
    (strict JSON has no NaN), recursively through dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "item") and type(obj).__module__ == "numpy":
        obj = obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj: Any) -> str:
    """Strict JSON (NaN/inf become null) with stable key order."""
    return json.dumps(plain(obj), indent=2, default=str)
