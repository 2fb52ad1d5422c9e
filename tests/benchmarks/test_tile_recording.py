"""benchmarks/tile_recording.py: the tiled trace is the recording, k times, and nothing else."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

ROOT = Path(__file__).resolve().parents[2]


def _tile_module():
    spec = importlib.util.spec_from_file_location("tile_recording", ROOT / "benchmarks" / "tile_recording.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _facts(con, run_id: str) -> dict:
    steps, dur_sum = con.execute("select count(*), sum(dur_ms) from iterations where run_id = ?", [run_id]).fetchone()
    ttft = con.execute(
        "select list(v order by v) from (select (t_first_token - t_arrival) * 1000 as v from requests where run_id = ?)",
        [run_id],
    ).fetchone()[0]
    # gaps straight from the stored lists, not from tracelat's derived tables
    gaps = con.execute(
        "select list(g * 1000 order by g) from (select unnest(list_transform("
        "list_zip(t_s[2:], t_s[:-2]), lambda p: p[1] - p[2])) as g from token_lists where run_id = ?)",
        [run_id],
    ).fetchone()[0]
    return {"steps": steps, "dur_ms": dur_sum, "ttft_ms": ttft, "gaps_ms": gaps}


def test_tiled_trace_is_the_recording_k_times(tmp_path):
    mod = _tile_module()
    if not all(p.exists() for p in mod.RECORDING):
        pytest.skip("no recorded vLLM CPU run in fixtures/vllm")
    rec = store.connect(":memory:")
    list(ingest_paths(rec, mod.RECORDING, run_id="rec"))
    one = _facts(rec, "rec")

    out = tmp_path / "tiled.jsonl"
    info = mod.tile(out, 2 * one["steps"] + 1, run_id="bench")  # one step more than 2 copies: 3 copies
    assert info["copies"] == 3

    con = store.connect(":memory:")
    (res,) = list(ingest_paths(con, [out]))
    assert res.rejected == 0 and res.accepted == res.lines_read
    got = _facts(con, "bench")
    assert got["steps"] == 3 * one["steps"] == info["iterations"]
    assert got["dur_ms"] == pytest.approx(3 * one["dur_ms"], rel=1e-12)
    # epoch seconds near 1.8e9 carry about 2.4e-7 s of float precision; shifting them moves a
    # difference by that much, far below a microsecond
    assert got["ttft_ms"] == pytest.approx(sorted(one["ttft_ms"] * 3), abs=1e-3)
    assert got["gaps_ms"] == pytest.approx(sorted(one["gaps_ms"] * 3), abs=1e-3)

    # copies follow each other: copy k is copy 0 shifted by k periods, steps never overlap
    starts = con.execute(
        "select list(t order by k) from (select split_part(req_id, '-', 1)::int as k, min(t_arrival) as t "
        "from requests group by k)"
    ).fetchone()[0]
    period = starts[1] - starts[0]
    assert period > 0 and starts[2] - starts[1] == pytest.approx(period, abs=1e-6)
    # steps of one copy never reach into the next (within a copy, the recording's own overlaps stay)
    spans = con.execute(
        "select list([lo, hi] order by k) from (select iter // ? as k, min(t_start) as lo, max(t_end) as hi "
        "from iterations group by k)",
        [one["steps"]],
    ).fetchone()[0]
    assert len(spans) == 3 and all(spans[k][0] > spans[k - 1][1] for k in (1, 2))
    run = json.loads(out.read_text().splitlines()[0])
    assert run["kind"] == "run" and "clock_alignment" not in run["meta"] and run["meta"]["max_num_seqs"] == 8
