"""Format detection from content, --format override, and a directory of mixed formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline import ingest
from pipeline.cli import cli
from pipeline.errors import InputError

FIX = Path(__file__).resolve().parents[2] / "fixtures"
SAMPLES = {
    "vllm/server.log": "vllm-log",
    "vllm/server_epoch.log": "vllm-log",
    "vllm/bench.json": "vllm-bench",
    "vllm/requests.jsonl": "vllm-requests",
    "trtllm/iteration_log.txt": "trtllm-iterlog",
    "trtllm/metrics.json": "trtllm-iterlog",
    "sglang/server.log": "sglang-log",
    "sglang/server_tp.log": "sglang-log",
    "sglang/sglang-request-metrics-20260301_10.log": "sglang-metrics",
    "genai_perf/profile_export.json": "genai-perf",
    "canonical/tiny.jsonl": "jsonl",
}


@pytest.mark.parametrize("rel, name", sorted(SAMPLES.items()))
def test_detect_from_content_not_name(tmp_path, rel, name):
    # a neutral file name: detection must come from the content
    blind = tmp_path / "upload.dat"
    shutil.copy(FIX / rel, blind)
    assert ingest.detect(blind).name == name


# Issue 14's formats (their fixtures hold deliberate rejects, so they stay out of SAMPLES,
# which the mixed-directory test below ingests expecting none)
SAMPLES_2026 = {
    "sglang/server_2026.log": "sglang-log",
    "fpm/fpm-relay-w0.jsonl": "fpm",
    "llmservingsim/meta.json": "llmservingsim-meta",
    "llmservingsim/timeseries.csv": "llmservingsim-timeseries",
    "guidellm/benchmarks.json": "guidellm",
    "inference_perf/per_request_lifecycle_metrics.json": "inference-perf",
    "otel/vllm-traces.jsonl": "otel",
    "prometheus/server_metrics_export.jsonl": "aiperf-server-metrics",
    "prometheus/vllm-0_metrics.log": "prometheus-text",
    "prometheus/query_range.json": "prometheus-range",
    "aiperf/profile_export.jsonl": "aiperf",
}


@pytest.mark.parametrize("rel, name", sorted(SAMPLES_2026.items()))
def test_detect_2026_formats_from_content_not_name(tmp_path, rel, name):
    blind = tmp_path / "upload.dat"
    shutil.copy(FIX / rel, blind)
    assert ingest.detect(blind).name == name


def test_detect_aiperf(realdata):
    assert (
        ingest.detect(realdata / "aiperf/tests/unit/plot/fixtures/qwen_concurrency1/profile_export.jsonl").name
        == "aiperf"
    )


def test_unknown_format_lists_known_ones(tmp_path):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\nworld\n")
    with pytest.raises(InputError) as exc:
        ingest.detect(odd)
    for name in ("vllm-log", "vllm-bench", "trtllm-iterlog", "sglang-log", "aiperf", "genai-perf", "--format"):
        assert name in str(exc.value)


def test_format_override(con, tmp_path):
    """--format wins over detection: a vLLM log read as SGLang has no SGLang lines at all."""
    (res,) = ingest.ingest_paths(con, [FIX / "vllm/server.log"], fmt="sglang-log")
    assert (res.format, res.accepted, res.rejected) == ("sglang-log", 0, 0)  # not even a run record
    assert res.run_ids == [] and "no sglang-log records in it" in res.line() and "is --format right?" in res.line()
    with pytest.raises(InputError, match="unknown format 'nope'; known formats: .*vllm-log"):
        ingest.ingest_paths(con, [FIX / "vllm/server.log"], fmt="nope")


def test_cli_mixed_directory_reports_each_file(tmp_path):
    d = tmp_path / "logs"
    for rel in SAMPLES:
        if rel.startswith("vllm/server_epoch"):
            continue
        dest = d / rel.replace("/", "_")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIX / rel, dest)
    db = tmp_path / "m.duckdb"
    out = CliRunner().invoke(cli, ["ingest", str(d), "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    results = {Path(r["path"]).name: r for r in json.loads(out.output)}
    assert {k: r["format"] for k, r in results.items()} == {
        rel.replace("/", "_"): f for rel, f in SAMPLES.items() if not rel.startswith("vllm/server_epoch")
    }
    assert all(r["rejected"] == 0 and r["lines_read"] == r["accepted"] + r["skipped"] for r in results.values())
    text = CliRunner().invoke(cli, ["ingest", str(d), "--db", str(tmp_path / "n.duckdb")])
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert len(lines) == len(results)
    assert any("[vllm-bench]: 64 read, 64 accepted, 0 rejected" in l for l in lines)
    assert any("[sglang-log]: 5 read, 3 accepted, 0 rejected, 2 skipped" in l for l in lines)  # the file's 5 lines


def test_a_note_that_quotes_sglang_lines_is_no_sglang_log(tmp_path):
    """fixtures/sglang/NOTE.md quotes `Prefill batch. iter: N`: it was taken for a log (one line
    rejected) instead of being skipped as the other notes are. A log line has a time of day."""
    note = tmp_path / "NOTE.md"
    note.write_text((Path(__file__).resolve().parents[2] / "fixtures" / "sglang" / "NOTE.md").read_text())
    with pytest.raises(InputError, match="unknown format"):
        ingest.detect(note)
    log = tmp_path / "s.log"
    log.write_text("[2026-05-19 00:32:51 DP0 TP0] Prefill batch. iter: 7, #new-seq: 2, #new-token: 128\n")
    assert ingest.detect(log).name == "sglang-log"
