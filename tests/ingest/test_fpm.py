"""ForwardPassMetrics: data-parallel ranks joined per step, envelopes, heartbeats, rejects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.ingest import detect, ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "fpm" / "fpm-relay-w0.jsonl"


def _load(tmp_path, path):
    con = store.connect(tmp_path / "f.duckdb")
    res = ingest_paths(con, [path], run_id="fpm")
    return con, res[0]


def test_ranks_are_joined_per_step(tmp_path):
    assert detect(FIX).name == "fpm"
    con, res = _load(tmp_path, FIX)
    rows = con.execute(
        "select iter, dur_ms, prefill_reqs, prefill_tokens, decode_reqs, decode_tokens, "
        "context_tokens, waiting_reqs, t_end from iterations order by iter"
    ).fetchall()
    src = [json.loads(line) for line in FIX.read_text().splitlines()]
    recs = [r.get("event", {}).get("fpm", r) for r in src if r]
    for it, dur, pr, pt, dr, dt, ctx, wait, t_end in rows:
        ranks = [r for r in recs if r["counter_id"] == it]
        s = [r["scheduled_requests"] for r in ranks]
        assert dur == pytest.approx(1000 * max(r["wall_time"] for r in ranks))  # the slowest rank
        assert (pr, pt) == (sum(x["num_prefill_requests"] for x in s), sum(x["sum_prefill_tokens"] for x in s))
        assert dr == dt == sum(x["num_decode_requests"] for x in s)
        assert ctx == sum(x["sum_decode_kv_tokens"] for x in s)
        assert wait == sum(
            r["queued_requests"]["num_prefill_requests"] + r["queued_requests"]["num_decode_requests"] for r in ranks
        )
        assert t_end == pytest.approx(max(r["timestamp"] for r in ranks))
    assert len(rows) == 4
    # 8 lines: 4 steps accepted, 3 rank lines merged into them and 1 heartbeat skipped
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (8, 4, 0, 4)
    meta = json.loads(con.execute("select meta from runs").fetchone()[0])
    assert meta["elapsed_time_scope"] == "execute_model_cuda" and meta["fpm_dp_ranks"] == 2


def test_broken_records_are_rejected_with_reasons(tmp_path):
    lines = FIX.read_text().splitlines()
    bad = json.loads(lines[2])
    del bad["wall_time"]
    neg = json.loads(lines[3])
    neg["scheduled_requests"]["num_decode_requests"] = -1
    broken = [lines[0], lines[1], json.dumps(bad), json.dumps(neg), '{"counter_id": 9, "scheduled', lines[1]]
    p = tmp_path / "fpm-broken.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(broken) + "\n")
    con, res = _load(tmp_path, p)
    rejects = dict(con.execute("select line_no, reason from rejects").fetchall())
    assert rejects == {
        3: "FPM record without wall_time",
        4: "FPM record with a negative count or wall_time",
        5: "not valid JSON (truncated or garbage line)",
        6: "duplicate FPM record of rank 1 of step 0 (first at line 2)",
    }
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (6, 1, 4, 1)


def test_several_workers_make_one_run_each(tmp_path):
    lines = [json.loads(x) for x in FIX.read_text().splitlines()]
    other = []
    for r in lines:
        if r and "event" not in r:
            r2 = dict(r, worker_id="w1")
            other.append(r2)
    p = tmp_path / "two.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in lines + other) + "\n")
    con, res = _load(tmp_path, p)
    runs = dict(con.execute("select run_id, count(*) from iterations group by 1").fetchall())
    assert runs == {"fpm-w0": 4, "fpm-w1": 4}
    assert res.lines_read == res.accepted + res.rejected + res.skipped


def test_a_step_split_over_rotated_files_says_to_join_them(tmp_path):
    """Rank 1 of step 1 in the second file: its reject told the user to give the file another run id,
    which splits one run in two; joined, the files give the one-file result."""
    lines = FIX.read_text().splitlines(keepends=True)
    first, second = tmp_path / "fpm.1.jsonl", tmp_path / "fpm.2.jsonl"
    first.write_text("".join(lines[:3]))
    second.write_text("".join(lines[3:]))
    con = store.connect(tmp_path / "r.duckdb")
    ingest_paths(con, [first, second], run_id="fpm")
    (reason,) = con.execute("select reason from rejects where line_no = 1").fetchall()[0]
    assert "duplicate iter 1 in run fpm" in reason and "cat A B > AB" in reason, reason
    joined = tmp_path / "fpm.jsonl"
    joined.write_text(first.read_text() + second.read_text())
    for d in ("j", "k"):
        (tmp_path / d).mkdir()
    con2, res = _load(tmp_path / "j", joined)
    ref, _ = _load(tmp_path / "k", FIX)
    q = "select iter, dur_ms, decode_tokens, context_tokens from iterations order by iter"
    assert con2.execute(q).fetchall() == ref.execute(q).fetchall() and res.rejected == 0
