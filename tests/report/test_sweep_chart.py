"""The sweep chart draws categorical swept values in the sweep's order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.replay.sweep import Sweep, SweepRow
from pipeline.report.sweep_chart import sweep_chart

DTYPES = ["bf16", "fp8", "int4", "fp32"]  # alphabetically: bf16, fp32, fp8, int4


def _sweep(param: str, values: list) -> Sweep:
    cal = SimpleNamespace(
        run_id="r",
        details={"kv_dtype": {"recorded": "bf16", "source": "runs.kv_dtype"}},
        baseline_policy={"prefix_caching": False, "max_num_batched_tokens": 512},
        policy_changes=dict,  # nothing changed beside the swept setting
        whatif={},
        workload_source=None,
    )
    rows = [SweepRow(v, [{"ttft_ms": {"p99": 100.0 + i}, "tpot_ms": {"p99": 10.0 + i}}]) for i, v in enumerate(values)]
    return Sweep(cal, param, [0], rows)


def _layers(spec: dict) -> list[dict]:
    return [layer for panel in spec["hconcat"] for layer in panel["layer"] if "encoding" in layer]


@pytest.mark.parametrize(
    "param, values, shown",
    [("kv_dtype", DTYPES, DTYPES), ("prefix_caching", [True, False], ["true", "false"])],
)
def test_categories_keep_the_sweep_order(param, values, shown):
    spec = sweep_chart(_sweep(param, values)).to_dict(validate=False)
    layers = _layers(spec)
    assert all(layer["encoding"]["x"]["sort"] == shown for layer in layers)
    lines = [layer for layer in layers if layer["mark"]["type"] == "line"]
    assert lines and all(line["encoding"]["order"]["field"] == "order" for line in lines)
    rows = {r["value"]: r["order"] for r in spec["data"]["values"]}
    assert [v for v, _ in sorted(rows.items(), key=lambda kv: kv[1])] == shown


def test_numbers_stay_on_a_log_axis():
    spec = sweep_chart(_sweep("max_num_batched_tokens", [256, 1024, 512])).to_dict(validate=False)
    for layer in _layers(spec):
        assert layer["encoding"]["x"]["type"] == "quantitative" and "sort" not in layer["encoding"]["x"]
        assert "order" not in layer["encoding"]
