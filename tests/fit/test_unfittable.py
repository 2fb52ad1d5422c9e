"""Runs the model cannot be fitted to: every command answers, and says what cannot be fitted."""

from __future__ import annotations

import json
import subprocess

import pytest
from ..clirun import run_cli

README_RUN = [  # the README's canonical example: a run record, one step, one request
    {
        "kind": "run",
        "run_id": "night-42",
        "engine": "myengine",
        "model": "llama-3.1-8b",
        "gpu": "H100-SXM",
        "clock": "monotonic",
    },
    {
        "kind": "iteration",
        "iter": 0,
        "t_start": 10.000,
        "t_end": 10.021,
        "prefill_tokens": 512,
        "prefill_reqs": 1,
        "decode_tokens": 0,
        "decode_reqs": 0,
        "context_tokens": 0,
    },
    {
        "kind": "request",
        "req_id": "r1",
        "t_arrival": 9.998,
        "t_scheduled": 10.000,
        "t_first_token": 10.021,
        "t_finish": 10.900,
        "prompt_tokens": 512,
        "output_tokens": 64,
        "token_times": [10.021, 10.035, 10.9],
    },
]


def cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    r = run_cli(*args, "--db", str(tmp_path / "u.duckdb"), cwd=tmp_path)  # an uncaught error raises here
    assert r.returncode == 0 and "Traceback" not in r.stderr and "Error" not in r.stderr, (args, r.stderr)
    return r


def ingest(tmp_path, lines: list[dict]) -> None:
    f = tmp_path / "run.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cli(tmp_path, "ingest", str(f))


def steps(n: int, dur_s: float = 0.02, **kw) -> list[dict]:
    return [
        {
            "kind": "iteration",
            "iter": i,
            "t_start": 1.0 + i * 0.05,
            "t_end": 1.0 + i * 0.05 + dur_s,
            "decode_tokens": 4,
            "decode_reqs": 4,
            "context_tokens": 100 * i,
        }
        | kw
        for i in range(n)
    ]


def test_readme_example_with_catalogued_model_and_gpu(tmp_path):
    ingest(tmp_path, README_RUN)
    fit = json.loads(cli(tmp_path, "fit", "night-42", "--json").stdout)
    assert fit["t0_ms"] is None and fit["hardware"]["weight_floor_ms"] > 0  # the catalogue was used
    assert [c["holds"] for c in fit["claims"]] == [None] * 4
    assert any("too few to fit" in s for s in fit["statements"])
    summary = json.loads(cli(tmp_path, "summary", "night-42", "--json").stdout)
    assert summary["fit"]["t0_ms"] is None and summary["ttft_ms"]["count"] == 1
    assert any("too few to fit" in s for s in summary["fit"]["statements"])
    cli(tmp_path, "report", "night-42", "--out", "rep")
    doc = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert doc["spikes"]["count"] == 0 and (tmp_path / "rep" / "index.html").stat().st_size > 0


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.long
def test_report_on_a_run_of_one_or_two_steps(tmp_path, n):
    ingest(tmp_path, [{"kind": "run", "run_id": "few", "model": "toy", "gpu": "none"}, *steps(n)])
    cli(tmp_path, "report", "few", "--out", "rep")
    doc = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert doc["iteration_ms"]["count"] == n
    # with nothing fitted no step is a stall (a NaN prediction used to flag them all)
    assert doc["spikes"]["count"] == 0


def test_all_zero_length_steps(tmp_path):
    ingest(
        tmp_path, [{"kind": "run", "run_id": "zero", "model": "llama-3.1-8b", "gpu": "H100-SXM"}, *steps(30, dur_s=0.0)]
    )
    fit = json.loads(cli(tmp_path, "fit", "zero", "--json").stdout)
    assert fit["t0_ms"] is None and "all 30 steps last 0 ms: iteration time cannot be fitted" in fit["statements"]
    assert "not fitted" in cli(tmp_path, "fit", "zero").stdout
    assert json.loads(cli(tmp_path, "summary", "zero", "--json").stdout)["iteration_ms"]["max"] == 0
    cli(tmp_path, "report", "zero", "--out", "rep")
