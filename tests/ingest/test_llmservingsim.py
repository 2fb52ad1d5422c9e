"""LLMServingSim bench companions: meta.json (run facts) and timeseries.csv (engine gauges)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import ingest, store
from pipeline.errors import InputError
from pipeline.ingest.engines import llmservingsim

from ..clirun import run_cli
from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "llmservingsim"
REAL = "llmservingsim/bench/examples"
RUNNING, KV = "vllm:num_requests_running", "vllm:kv_cache_usage_perc"


def folder(tmp_path: Path, csv_text: str | None = None, **meta_changes) -> Path:
    """A copy of the fixture folder, with the CSV body and meta.json keys replaced as given."""
    d = tmp_path / "run"
    shutil.copytree(FIX, d)
    if csv_text is not None:
        (d / "timeseries.csv").write_text(csv_text)
    if meta_changes:
        doc = json.loads((d / "meta.json").read_text())
        doc.update(meta_changes)
        (d / "meta.json").write_text(json.dumps(doc))
    return d


def started(doc: dict) -> float:
    return dt.datetime.fromisoformat(doc["started_at"].replace("Z", "+00:00")).timestamp()


def test_meta_json_becomes_the_run_record(con):
    (res,) = load(con, FIX / "meta.json", run_id="sim")
    assert (res.format, res.accepted, res.rejected) == ("llmservingsim-meta", 1, 0)
    engine, ver, model, num_gpus, dtype, kv_dtype, meta = con.execute(
        "select engine, engine_version, model, num_gpus, dtype, kv_dtype, meta from runs where run_id = 'sim'"
    ).fetchall()[0]
    meta = json.loads(meta)
    # tensor_parallel_size 2 x data_parallel_size 1 x (no pipeline parallelism) = 2 GPUs
    assert (engine, ver, model, num_gpus, dtype, kv_dtype) == (
        "vllm",
        "0.19.0",
        "example-org/tiny-llama",
        2,
        "bfloat16",
        "fp8",
    )
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"], meta["kv_cache_tokens"]) == (8, 512, 1024)
    assert (meta["kv_block_size"], meta["kv_gpu_blocks"], meta["tick_seconds"]) == (16, 64, 1.0)


def test_timeseries_rows_become_gauges_at_started_at_plus_t(con):
    (res,) = load(con, FIX / "timeseries.csv", run_id="sim")
    assert (res.format, res.accepted, res.rejected, res.skipped) == ("llmservingsim-timeseries", 9, 0, 1)
    t0 = started(json.loads((FIX / "meta.json").read_text()))
    rows = list(csv.DictReader((FIX / "timeseries.csv").open()))
    for family, column, scale in (
        (RUNNING, "running", 1.0),
        ("vllm:num_requests_waiting", "waiting", 1.0),
        (KV, "kv_cache_pct", 0.01),  # a percent in the CSV, a fraction in vLLM's gauge
        ("vllm:avg_generation_throughput_toks_per_s", "gen_throughput", 1.0),
    ):
        got = con.execute(
            "select t, value from metric_samples where run_id = 'sim' and family = ? order by t", [family]
        ).fetchall()
        want = [(t0 + float(r["t"]), float(r[column]) * scale) for r in rows]
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-12)
    assert con.execute("select clock from runs where run_id = 'sim'").fetchall() == [("unix",)]


def test_preemptions_per_tick_add_up_to_vllm_s_counter(con, tmp_path):
    body = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct,preempted\n"
    body += "1.0,10,1,1,0,5,0\n2.0,0,9,2,0,9,2\n3.0,0,9,2,0,9,0\n4.0,0,9,1,0,5,3\n"
    d = folder(tmp_path, body)
    load(con, d / "timeseries.csv", run_id="sim")
    got = con.execute(
        "select value from metric_samples where family = 'vllm:num_preemptions_total' order by t"
    ).fetchall()
    assert [v for (v,) in got] == [0, 2, 2, 5]


def test_bad_rows_are_rejected_with_their_line_and_reason(con, tmp_path):
    body = (
        "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
        "1.0,10,1,1,0,5\n"
        "2.0,10,1,1,0\n"  # line 3: a value short
        "3.0,ten,1,1,0,5\n"  # line 4: not a number
        "4.0,10,1,1,0,140\n"  # line 5: above 100 percent
        "2.5,10,1,1,0,5\n"  # line 6: after every accepted tick so far (1.0), so kept
        "5.0,10,1,1,0,5\n"
        "5.0,10,1,1,0,5\n"  # line 8: repeated tick
    )
    d = folder(tmp_path, body)
    (res,) = load(con, d / "timeseries.csv", run_id="sim")
    rejects = dict(con.execute("select line_no, reason from rejects order by line_no").fetchall())
    assert set(rejects) == {3, 4, 5, 8}
    assert "expected 6 comma-separated values" in rejects[3]
    assert "prompt_throughput" in rejects[4]
    assert "above 100" in rejects[5]
    assert "not after an earlier row" in rejects[8]
    assert all("timeseries.csv: fix or delete the row" in r for r in rejects.values())
    # every line is accounted for: the header is skipped, the rest accepted or rejected
    assert res.lines_read == res.accepted + res.rejected + res.skipped == 8
    assert res.accepted == 3


def test_without_meta_json_the_file_is_refused_naming_it(tmp_path):
    d = tmp_path / "alone"
    d.mkdir()
    shutil.copy(FIX / "timeseries.csv", d)
    from pipeline import store

    con = store.connect(tmp_path / "s.duckdb")
    try:
        with pytest.raises(InputError, match=r"meta\.json.*started_at|started_at.*meta\.json"):
            ingest.ingest_paths(con, [d / "timeseries.csv"], run_id="sim")
    finally:
        con.close()


def test_a_kv_column_of_zeros_under_load_is_not_stored_as_an_empty_cache(con, tmp_path):
    body = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,10,1,3,0,0.0\n2.0,0,9,2,0,0.0\n"
    d = folder(tmp_path, body)
    load(con, d / "timeseries.csv", run_id="sim")
    assert con.execute("select count(*) from metric_samples where family = ?", [KV]).fetchall() == [(0,)]
    meta = json.loads(con.execute("select meta from runs").fetchall()[0][0])
    assert "did not record it" in meta["kv_cache_pct_unrecorded"]
    assert con.execute("select count(*) from metric_samples where family = ?", [RUNNING]).fetchall() == [(2,)]


def test_bad_meta_keys_are_one_reject_naming_each_key(con, tmp_path):
    d = folder(tmp_path, schema_version=2, engine_kwargs={"max_num_seqs": -4}, started_at="yesterday")
    (res,) = load(con, d / "meta.json", run_id="sim")
    assert (res.accepted, res.rejected) == (0, 1)
    (reason,) = con.execute("select reason from rejects").fetchall()[0]
    for part in ("schema_version", "engine_kwargs.max_num_seqs", "started_at"):
        assert part in reason


def test_files_of_one_run_that_disagree_are_reported(con, tmp_path):
    a = folder(tmp_path)
    b = tmp_path / "other"
    shutil.copytree(FIX, b)
    doc = json.loads((b / "meta.json").read_text())
    doc["engine_kwargs"]["max_num_seqs"] = 64
    (b / "meta.json").write_text(json.dumps(doc))
    (first,) = ingest.ingest_paths(con, [a / "meta.json"], run_id="sim")
    (second,) = ingest.ingest_paths(con, [b / "meta.json"], run_id="sim")
    assert first.conflicts == []
    (text,) = second.conflicts
    assert "meta.max_num_seqs is '64' in this file but '8'" in text and "--run-id" in text


def test_a_model_path_and_its_served_name_agree(con, tmp_path):
    b = folder(tmp_path, model="/models/Example-Org/TINY-LLAMA")
    ingest.ingest_paths(con, [FIX / "meta.json"], run_id="sim")
    (res,) = ingest.ingest_paths(con, [b / "meta.json"], run_id="sim")
    assert res.conflicts == []


# --- real runs (casys-kaist/LLMServingSim bench examples, vLLM 0.19) -----------------------


@pytest.mark.parametrize(
    "gpu, model",
    [
        ("RTX4090", "Llama-3.1-8B"),
        ("RTXPRO6000", "Llama-3.1-8B"),
        ("RTXPRO6000", "Qwen3-30B-A3B-Instruct-2507"),
        ("RTXPRO6000", "Qwen3-32B"),
    ],
)
def test_real_bench_folder_loads_as_one_run_on_one_clock(con, realdata, gpu, model):
    run = realdata / REAL / gpu / model / "vllm"
    results = load(con, run, run_id="q")
    assert sorted(r.format for r in results) == ["llmservingsim-meta", "llmservingsim-timeseries", "vllm-requests"]
    assert all(r.rejected == 0 and r.conflicts == [] for r in results)
    rows = list(csv.DictReader((run / "timeseries.csv").open()))
    assert con.execute("select count(*) from metric_samples where family = ?", [RUNNING]).fetchall() == [(len(rows),)]

    # the engine's requests (running + waiting: preempted ones wait again) at each tick's end
    # against the requests between entering the engine queue and their last token at that
    # instant, from requests.jsonl (another file, another clock): they agree only when both
    # files sit on one clock, and half a second either way already spoils the match
    def mismatch(shift_s: float) -> tuple[int, float]:
        return con.execute(
            """
            with g as (select t + $s as t, sum(value) as value from metric_samples
                       where family in ($r, 'vllm:num_requests_waiting') group by t),
            c as (select g.value, (select count(*) from requests q
                                   where (q.extra->>'t_queued')::double <= g.t and q.t_finish > g.t) as n
                  from g)
            select count(*), avg(abs(value - n)) from c
            """,
            {"s": shift_s, "r": RUNNING},
        ).fetchall()[0]

    n, mad = mismatch(0.0)
    assert n == len(rows) and mad < 1.0
    assert min(mismatch(-0.5)[1], mismatch(0.5)[1]) > mad + 0.5
    meta = json.loads(con.execute("select meta from runs where run_id = 'q'").fetchall()[0][0])
    kv = con.execute("select value from metric_samples where family = ? order by t", [KV]).fetchall()
    pct = [float(r["kv_cache_pct"]) for r in rows]
    if any(pct):
        np.testing.assert_allclose([v for (v,) in kv], [p / 100 for p in pct])
    else:  # these runs' logger never filled the column
        assert kv == [] and "kv_cache_pct_unrecorded" in meta


def test_parse_started_at_reads_the_bench_s_stamp_as_utc():
    assert llmservingsim.parse_started_at("2026-04-25T18:49:44.514072Z") == pytest.approx(1777142984.514072)
    assert llmservingsim.parse_started_at("2026-04-25T18:49:44.514072") == pytest.approx(1777142984.514072)
    assert llmservingsim.parse_started_at("not a time") is None
    assert llmservingsim.parse_started_at(12) is None


def test_cli_warns_when_files_of_one_run_disagree(tmp_path):
    a = folder(tmp_path, model="example-org/other-model")
    db = tmp_path / "w.duckdb"
    assert run_cli("ingest", FIX / "meta.json", "--run-id", "sim", "--db", db).returncode == 0
    res = run_cli("ingest", a / "meta.json", "--run-id", "sim", "--db", db)
    assert res.returncode == 0
    assert "warning:" in res.stderr and "model is 'example-org/other-model' in this file" in res.stderr
    assert "warning" not in res.stdout


@pytest.mark.long
def test_a_bench_folder_is_one_run_named_after_it(con, tmp_path):
    """Without --run-id the folder's files made three runs, "meta", "requests" and "timeseries": the
    engine gauges sat apart from the run they describe. Folders of several experiments are told
    apart by the folders above them."""
    for gpu in ("A100", "H100"):
        d = tmp_path / "bench" / gpu / "vllm"
        d.mkdir(parents=True)
        for f in ("meta.json", "timeseries.csv"):
            shutil.copy(FIX / f, d / f)
    res = load(con, tmp_path / "bench" / "A100" / "vllm")
    assert {r for x in res for r in x.run_ids} == {"vllm"}, [x.line() for x in res]
    assert con.execute("select count(*) from runs").fetchall()[0][0] == 1
    both = store.connect(tmp_path / "both.duckdb")
    res = load(both, tmp_path / "bench")
    assert sorted({r for x in res for r in x.run_ids}) == ["A100/vllm", "H100/vllm"], [x.line() for x in res]
    per_run = both.execute("select run_id, count(*) from metric_samples group by 1 order by 1").fetchall()
    assert [r for r, _ in per_run] == ["A100/vllm", "H100/vllm"] and per_run[0][1] == per_run[1][1] > 0
