"""compare warns when the runs share few statistics and refuses when they share none;
``runs`` keeps its columns apart (issue 15 item 17)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from .conftest import run_lines


def cli(*args) -> tuple[int, str, str]:
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.long
def test_runs_sharing_nothing_or_little(tmp_path):
    db = tmp_path / "t.duckdb"
    full = run_lines("full", 1.0, 1, n_req=60, n_iter=100)
    steps_only = [x for x in run_lines("steps", 1.0, 2, n_req=60, n_iter=100) if x["kind"] != "request"]
    reqs_only = [x for x in run_lines("reqs", 1.0, 3, n_req=60, n_iter=100) if x["kind"] != "iteration"]
    for name, lines in (("full", full), ("steps", steps_only), ("reqs", reqs_only)):
        assert cli("ingest", write(tmp_path / f"{name}.jsonl", lines), "--db", db)[0] == 0
    out_dir = tmp_path / "cmp"
    code, out, err = cli("compare", "steps", "reqs", "--db", db, "--out", out_dir, "--resamples", "100")
    assert code == 2 and "share no statistic to compare" in err, (out, err)

    code, out, err = cli("compare", "full", "steps", "--db", db, "--out", out_dir, "--resamples", "100")
    assert code in (0, 1), err
    assert "warning: ttft_ms not compared: the candidate has 0 values of it (the baseline 60): fewer than 2" in err
    assert "warning: only 1 of " in err and "(iteration_ms): a pass says nothing about the others" in err


def test_runs_columns_stay_apart(tmp_path):
    db = tmp_path / "t.duckdb"
    lines = run_lines("a-rather-long-run-identifier-for-the-nightly-job", 1.0, 1, n_req=5, n_iter=5)
    lines[0].update(engine="vllm-with-a-long-name", model="meta-llama/Llama-3.1-70B-Instruct-FP8-dynamic")
    assert cli("ingest", write(tmp_path / "a.jsonl", lines), "--db", db)[0] == 0
    code, out, _ = cli("runs", "--db", db)
    assert code == 0
    header, row = out.splitlines()
    assert row.split() == [
        "a-rather-long-run-identifier-for-the-nightly-job",
        "vllm-with-a-long-name",
        "meta-llama/Llama-3.1-70B-Instruct-FP8-dynamic",
        "5",
        "5",
        row.split()[-1],
    ]
    assert header.split() == ["run_id", "engine", "model", "requests", "iterations", "duration_s"]
    assert header.index("model") == row.index("meta-llama")  # aligned under its header


@pytest.mark.long
def test_runs_of_different_setups_are_named(tmp_path):
    """A comparison across models, GPUs or batch limits measures all of them at once: say which
    differ (in the terminal, the JSON and the page), and nothing when the setups agree or a run
    does not state a fact."""
    db = tmp_path / "t.duckdb"
    setups = {
        "base": {"model": "llama-8b", "gpu": "RTX 4090", "meta": {"max_num_seqs": 256, "chunked_prefill": True}},
        # the same facts written otherwise (a string for a number, another case)
        "same": {"model": "llama-8b", "gpu": "RTX 4090", "meta": {"max_num_seqs": "256", "chunked_prefill": "true"}},
        "other": {
            "model": "qwen-32b<b>",
            "gpu": "RTX 4090",
            "meta": {"max_num_seqs": 128, "chunked_prefill": False, "kv_cache_tokens": 5000},
        },
        "unsaid": {"meta": {}},
    }
    for i, (name, facts) in enumerate(setups.items()):
        lines = run_lines(name, 1.0, i + 1, n_req=60, n_iter=100)
        lines[0].update(facts)
        assert cli("ingest", write(tmp_path / f"{name}.jsonl", lines), "--db", db)[0] == 0
    args = ("--db", db, "--resamples", "100", "--json")
    code, out, err = cli("compare", "base", "other", "--out", tmp_path / "c1", *args)
    assert code in (0, 1), err
    (warning,) = [w for w in json.loads(out)["warnings"] if "different setups" in w]
    assert "model llama-8b (baseline) vs qwen-32b<b>" in warning and "max_num_seqs 256 (baseline) vs 128" in warning
    assert "chunked_prefill True (baseline) vs False" in warning  # as the vLLM log ingestor records it
    assert "gpu" not in warning and "kv_cache_tokens" not in warning  # the same on both; said by one only
    assert f"warning: {warning}" in err
    page = (tmp_path / "c1" / "index.html").read_text()
    assert "qwen-32b&lt;b&gt;" in page and "qwen-32b<b>" not in page
    for cand in ("same", "unsaid"):
        code, out, err = cli("compare", "base", cand, "--out", tmp_path / cand, *args)
        assert code in (0, 1) and not any("different setups" in w for w in json.loads(out)["warnings"]), err


@pytest.mark.long
def test_runs_timed_by_a_client_and_by_the_server_are_named(tmp_path):
    """One vLLM run's requests as the benchmark client saw them (bench.json) and as the server
    recorded them (requests.jsonl): their TTFT differ by the network and the HTTP server, and the
    comparison said nothing of it."""
    from pathlib import Path

    vllm = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    db = tmp_path / "t.duckdb"
    again = tmp_path / "bench.json"  # the same client's records again, from another file
    again.write_bytes((vllm / "bench.json").read_bytes())
    for name, f in (("client", vllm / "bench.json"), ("server", vllm / "requests.jsonl"), ("client2", again)):
        assert cli("ingest", f, "--run-id", name, "--db", db)[0] == 0
    code, _, err = cli("compare", "client", "server", "--db", db, "--out", tmp_path / "c", "--resamples", "100")
    assert code in (0, 1), err
    assert (
        "warning: the runs' requests were timed at different places: the baseline's by the client (vllm-bench), "
        "the candidate's by the server (vllm-requests)"
    ) in err
    code, _, err = cli("compare", "client", "client2", "--db", db, "--out", tmp_path / "c2", "--resamples", "100")
    assert code == 0 and "timed at different places" not in err, err
