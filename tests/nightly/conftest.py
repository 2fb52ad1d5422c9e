"""Simulated nights for the nightly command's tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.cli import main


def simulate_night(folder: Path, seed: int, a_ms_per_ctx: float = 0.0002, requests: int = 80) -> Path:
    """One night's trace (a folder holding it), every night the same run id, as engines do."""
    from pipeline.sim import IterationModel, WorkloadSpec, run_simulation

    folder.mkdir(parents=True, exist_ok=True)
    run_simulation(
        folder / "trace.jsonl",
        truth=False,
        run_id="bench",
        seed=seed,
        spec=WorkloadSpec(requests=requests, prompt_mean=1024),
        model=IterationModel(a_ms_per_ctx=a_ms_per_ctx),
        model_name="llama-3.1-8b",
        gpu="h100-sxm",
    )
    return folder


def tpot_from_trace(path: Path) -> np.ndarray:
    """TPOT of every finished multi-token request, straight from the trace file."""
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    reqs = [
        r
        for r in recs
        if r.get("kind") == "request"
        and r.get("status", "ok") == "ok"
        and r.get("output_tokens", 0) > 1
        and r.get("t_first_token") is not None
    ]
    return np.array([(r["t_finish"] - r["t_first_token"]) * 1000 / (r["output_tokens"] - 1) for r in reqs])


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err
