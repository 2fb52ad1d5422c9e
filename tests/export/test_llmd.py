"""llm-d Benchmark Report v0.2.1 export: valid against the published schema's facts, numbers
equal to the source's own (vLLM's reported statistics, numpy on the raw arrays)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from pipeline import store
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA = json.loads((FIX / "llmd" / "br_v0_2_1_subset.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())

# llm-d's pydantic validators (not in its JSON Schema): the units each field allows
UNITS = {
    ("latency", "time_to_first_token"): {"ms", "s"},
    ("latency", "request_latency"): {"ms", "s"},
    ("latency", "time_per_output_token"): {"ms/token", "s/token"},
    ("latency", "inter_token_latency"): {"ms/token", "s/token"},
    ("latency", "normalized_time_per_output_token"): {"ms/token", "s/token"},
    ("throughput", "input_token_rate"): {"tokens/s"},
    ("throughput", "output_token_rate"): {"tokens/s"},
    ("throughput", "total_token_rate"): {"tokens/s"},
    ("throughput", "request_rate"): {"queries/s"},
    ("requests", "input_length"): {"count", "pixels"},
    ("requests", "output_length"): {"count", "pixels"},
}


def _errors(doc: dict) -> list[str]:
    out = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]
    agg = doc["results"].get("request_performance", {}).get("aggregate", {})
    for (section, field), allowed in UNITS.items():
        st = agg.get(section, {}).get(field)
        if st is not None and st["units"] not in allowed:
            out.append(f"{section}.{field}: units {st['units']!r} not in {sorted(allowed)}")
    t = doc["run"].get("time", {})
    for k in ("start", "end"):  # FormatChecker skips date-time without its optional package: parse here
        if k in t:
            dt.datetime.fromisoformat(t[k].replace("Z", "+00:00"))
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llmd")
    path = tmp / "l.duckdb"
    con = store.connect(path)
    ingest_paths(con, [FIX / "vllm" / "bench.json"], run_id="bench")
    ingest_paths(con, [FIX / "vllm" / "server_epoch.log", FIX / "vllm" / "requests.jsonl"], run_id="joint")
    ingest_paths(con, [FIX / "vllm" / "server_epoch.log"], run_id="steps")
    store.build_derived(con)
    yield con
    con.close()


def _report(con, run_id):
    from pipeline.export.llmd import report

    return report(con, run_id)


@pytest.mark.parametrize("run_id", ["bench", "joint", "steps"])
def test_reports_are_valid(db, run_id):
    doc = _report(db, run_id)
    assert doc["version"] == "0.2.1"
    assert _errors(doc) == []


def test_the_validator_refuses_what_llmd_refuses(db):
    """The checks above can fail: each mutation breaks one published rule."""
    doc = _report(db, "bench")
    bad = []
    for mutate in (
        lambda d: d.update(extra_field=1),  # additionalProperties: false at the root
        lambda d: d["run"].pop("uid"),  # run.uid is required
        lambda d: d["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"].update(
            units="msec"
        ),  # not a Units member
        lambda d: d["results"]["request_performance"]["aggregate"]["requests"].update(total=-1),  # minimum 0
        lambda d: d["scenario"]["load"]["standardized"].update(source="synthetic"),  # LoadSource enum
        lambda d: d["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"].update(
            units="ms/token"
        ),  # a Units member, but not a time (pydantic validator)
    ):
        d = copy.deepcopy(doc)
        mutate(d)
        bad.append(len(_errors(d)))
    assert all(n >= 1 for n in bad), bad


def test_latency_equals_vllms_own_statistics(db):
    """vLLM bench writes its own mean/median/p99 TTFT, TPOT and ITL: the report carries the same."""
    raw = json.loads((FIX / "vllm" / "bench.json").read_text())
    lat = _report(db, "bench")["results"]["request_performance"]["aggregate"]["latency"]
    for ours, theirs in (
        ("time_to_first_token", "ttft"),
        ("time_per_output_token", "tpot"),
        ("inter_token_latency", "itl"),
    ):
        st = lat[ours]
        assert st["mean"] == pytest.approx(raw[f"mean_{theirs}_ms"], rel=1e-9, abs=1e-9), ours
        assert st["p50"] == pytest.approx(raw[f"median_{theirs}_ms"], rel=1e-9, abs=1e-9), ours
        assert st["p99"] == pytest.approx(raw[f"p99_{theirs}_ms"], rel=1e-9, abs=1e-9), ours


def test_counts_lengths_and_rates_from_the_raw_arrays(db):
    raw = json.loads((FIX / "vllm" / "bench.json").read_text())
    doc = _report(db, "bench")
    agg = doc["results"]["request_performance"]["aggregate"]
    ok = np.array([not e for e in raw["errors"]])
    assert agg["requests"]["total"] == len(raw["input_lens"])
    assert agg["requests"]["failures"] == int((~ok).sum()) == raw["failed"]
    isl = np.array(raw["input_lens"])[ok]
    st = agg["requests"]["input_length"]
    assert st["units"] == "count" and (st["min"], st["max"]) == (int(isl.min()), int(isl.max()))
    for key, q in (("p5", 5), ("p25", 25), ("p50", 50), ("p75", 75), ("p99p9", 99.9)):
        assert st[key] == pytest.approx(np.percentile(isl, q), rel=1e-12), key
    assert st["stddev"] == pytest.approx(isl.std(ddof=1), rel=1e-12)
    osl = np.array(raw["output_lens"])[ok]
    lat_s = np.array(raw["latencies"])[ok]
    ntpot = lat_s * 1000 / osl
    assert agg["latency"]["normalized_time_per_output_token"]["mean"] == pytest.approx(ntpot.mean(), rel=1e-9)
    assert agg["latency"]["request_latency"]["p90"] == pytest.approx(np.percentile(lat_s * 1000, 90), rel=1e-9)
    # rates over the run's span: first request sent to last finished
    starts = np.array(raw["start_times"])[ok]
    span = (starts + lat_s).max() - np.array(raw["start_times"]).min()
    tp = agg["throughput"]
    assert tp["output_token_rate"]["mean"] == pytest.approx(osl.sum() / span, rel=1e-9)
    assert tp["input_token_rate"]["mean"] == pytest.approx(isl.sum() / span, rel=1e-9)
    assert tp["total_token_rate"]["mean"] == pytest.approx((isl.sum() + osl.sum()) / span, rel=1e-9)
    assert tp["request_rate"]["mean"] == pytest.approx(ok.sum() / span, rel=1e-9)
    assert doc["scenario"]["load"]["standardized"]["input_seq_len"]["value"] == pytest.approx(isl.mean())
    assert doc["run"]["time"]["duration"] == f"PT{span:.6f}S"
    assert "start" not in doc["run"]["time"]  # perf_counter clock: no wall-clock start to state


def test_engine_side_statistics_and_wall_clock(db):
    doc = _report(db, "joint")
    comp = doc["results"]["observability"]["components"][0]["aggregate"]
    kv = [
        r[0]
        for r in db.execute(
            "select kv_usage * 100 from iteration_metrics where run_id = 'joint' and kv_usage is not null"
        ).fetchall()
    ]
    assert comp["kv_cache_usage"]["units"] == "percent"
    assert comp["kv_cache_usage"]["mean"] == pytest.approx(np.mean(kv), rel=1e-12)
    assert comp["kv_cache_usage"]["p95"] == pytest.approx(np.percentile(kv, 95), rel=1e-12)
    t_first, t_last = db.execute("select t_first, t_last from run_summary where run_id = 'joint'").fetchall()[0]
    start = dt.datetime.fromisoformat(doc["run"]["time"]["start"].replace("Z", "+00:00")).timestamp()
    end = dt.datetime.fromisoformat(doc["run"]["time"]["end"].replace("Z", "+00:00")).timestamp()
    assert (start, end) == (pytest.approx(t_first, abs=1e-6), pytest.approx(t_last, abs=1e-6))
    steps_only = _report(db, "steps")
    assert "request_performance" in steps_only["results"]  # the engine's decode rate still is a rate
    assert "requests" not in steps_only["results"]["request_performance"]["aggregate"]
    assert "scenario" not in steps_only


def test_uid_is_stable_and_per_run(db):
    a, b = _report(db, "bench")["run"]["uid"], _report(db, "bench")["run"]["uid"]
    assert a == b != _report(db, "joint")["run"]["uid"]


def test_cli_writes_the_report_and_refuses_two_targets(tmp_path):
    from pipeline.cli import run_captured

    db = tmp_path / "c.duckdb"
    con = store.connect(db)
    ingest_paths(con, [FIX / "vllm" / "bench.json"], run_id="bench")
    con.close()
    out = tmp_path / "r" / "bench.json"
    code, text = run_captured("export", "bench", "--db", db, "--llm-d", out)
    assert code == 0, text
    assert _errors(json.loads(out.read_text())) == []
    assert "llm-d Benchmark Report v0.2.1, 64 requests" in text
    code, text = run_captured("export", "bench", "--db", db, "--llm-d", out, "--perfetto", tmp_path / "t.json")
    assert code == 2 and "Error: say where to, once" in text


def test_max_steps_without_perfetto_is_refused(tmp_path):
    """--max-steps samples a Perfetto trace only: with --llm-d or --lake it did nothing, silently."""
    from pipeline.cli import run_captured

    db = tmp_path / "c.duckdb"
    con = store.connect(db)
    ingest_paths(con, [FIX / "vllm" / "bench.json"], run_id="bench")
    con.close()
    out = tmp_path / "bench.json"
    code, text = run_captured("export", "bench", "--db", db, "--llm-d", out, "--max-steps", "5000")
    assert code == 2 and not out.exists()
    assert text.strip() == (
        "Error: --max-steps samples the steps of a Perfetto trace; --llm-d keeps every step: "
        "drop --max-steps, or write the trace with --perfetto FILE"
    )
    code, text = run_captured("export", "bench", "--db", db, "--lake", tmp_path / "lake", "--max-steps", "5000")
    assert code == 2 and "--lake keeps every step: drop --max-steps" in text and not (tmp_path / "lake").exists()
