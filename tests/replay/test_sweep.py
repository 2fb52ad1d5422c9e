"""What-if on a simulated incident: a smaller prefill chunk lowers p99 TPOT and raises TTFT."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from pipeline import store
from pipeline.audit import load_slo
from pipeline.errors import InputError
from pipeline.replay import calibrate, compare, parse_sweep, replay_once, run_sweep
from pipeline.report.sweep_chart import chart_rows, save_chart
from pipeline.sim import Policy, WorkloadSpec

from .conftest import simulated_store
from ..clirun import run_cli

VALUES = [256, 512, 1024, 2048]
SEEDS = [0, 1]
SLO = """
[slo]
tpot_ms.p99 = 25
ttft_ms.p99 = 4500
[goodput]
ttft_ms = 3000
tpot_ms = 40
min_attainment = 0.9
"""


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    """Steady load (10 req/s) plus a burst of 20 prompts of 6000 tokens at t = 30 s; recorded chunk 2048."""
    d = tmp_path_factory.mktemp("incident")
    spec = WorkloadSpec(
        requests=800,
        rate_rps=10.0,
        prompt_mean=400,
        output_mean=120,
        burst_at_s=30.0,
        burst_count=20,
        burst_prompt_tokens=6000,
        burst_output_tokens=40,
        burst_spread_s=1.0,
    )
    db = simulated_store(
        d,
        "incident",
        spec,
        policy=Policy(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=400_000, chunked_prefill=True),
    )
    (d / "slo.toml").write_text(SLO)
    con = store.open_for_reading(db)
    cal = calibrate(con, "incident")
    sweep = run_sweep(cal, "max_num_batched_tokens", VALUES, SEEDS, load_slo(d / "slo.toml"))
    con.close()  # the CLI test opens the store in another process
    return db, cal, sweep, d


def _means(sweep, metric, stat):
    return np.array([r.mean(metric, stat) for r in sweep.rows])


@pytest.mark.long
def test_smaller_chunks_lower_p99_tpot_and_raise_ttft(incident):
    _, _, sweep, _ = incident
    tpot99 = _means(sweep, "tpot_ms", "p99")
    ttft99 = _means(sweep, "ttft_ms", "p99")
    ttft50 = _means(sweep, "ttft_ms", "p50")
    # rows are in chunk order 256 .. 2048: decode steps carry less prefill, prompts take more steps
    assert np.all(np.diff(tpot99) > 0), tpot99
    assert np.all(np.diff(ttft99) < 0), ttft99
    assert ttft50[0] > ttft50[-1]
    # the mechanism, in numbers: the recorded chunk's p99 TPOT is several times the 256-token one
    assert tpot99[-1] > 3 * tpot99[0]
    # throughput does not depend on the chunk (same work, open-loop arrivals)
    tput = _means(sweep, "throughput", "output_tokens_per_s")
    assert np.ptp(tput) / tput.mean() < 0.01


def test_slo_marks_only_the_settings_that_meet_it_in_every_seed(incident):
    _, _, sweep, _ = incident
    assert [r.meets for r in sweep.rows] == [False, True, False, False]
    for row in sweep.rows:  # re-judge each limit from the per-seed statistics
        checks = {c["slo"]: c for c in row.slo}
        for name, (metric, stat, limit) in {
            "tpot_ms.p99": ("tpot_ms", "p99", 25),
            "ttft_ms.p99": ("ttft_ms", "p99", 4500),
        }.items():
            vals = [s[metric][stat] for s in row.per_seed]
            assert checks[name]["values"] == vals
            assert checks[name]["meets"] == all(v <= limit for v in vals)


def test_goodput_attainment_against_per_request_numpy(incident):
    _, cal, sweep, _ = incident
    row = sweep.rows[1]
    res, _ = replay_once(cal.with_policy(max_num_batched_tokens=row.value), SEEDS[0])
    rq = res.requests
    ttft = (rq["t_first_token"] - rq["t_arrival"]) * 1000
    n = rq["output_tokens"]
    tpot = np.where(n > 1, (rq["t_finish"] - rq["t_first_token"]) * 1000 / np.maximum(n - 1, 1), 0.0)
    good = (rq["status"] == "ok") & (ttft <= 3000) & (tpot <= 40)
    assert row.per_seed[0]["goodput"]["attainment"] == pytest.approx(good.sum() / len(good), rel=1e-12)
    check = next(c for c in row.slo if c["slo"] == "goodput.attainment")
    assert check["meets"] == all(s["goodput"]["attainment"] >= 0.9 for s in row.per_seed)


def test_recorded_row_equals_the_validation_replay(incident):
    db, cal, sweep, _ = incident
    recorded = next(r for r in sweep.rows if r.value == 2048)
    con = store.open_for_reading(db)
    cmp = compare(con, cal, SEEDS)
    con.close()
    for s_sweep, s_val in zip(recorded.per_seed, cmp.replays):
        assert s_sweep["tpot_ms"]["p99"] == s_val["tpot_ms"]["p99"]
        assert s_sweep["ttft_ms"]["p50"] == s_val["ttft_ms"]["p50"]


def test_table_and_json(incident):
    _, _, sweep, _ = incident
    text = sweep.format()
    lines = {m.group(1): line for line in text.splitlines() if (m := re.match(r"\s*(\d+)( \(as recorded\))?\s", line))}
    assert set(lines) == {str(v) for v in VALUES}
    assert "(as recorded)" in lines["2048"] and "(as recorded)" not in lines["512"]
    assert lines["512"].rstrip().endswith("meets")
    assert "fails: ttft_ms.p99" in lines["256"] and "fails: tpot_ms.p99" in lines["2048"]
    header = text.splitlines()[2]
    assert header.split()[:3] == ["max_num_batched_tokens", "ttft", "p50"] and header.rstrip().endswith("SLO")
    doc = sweep.to_dict()
    assert [r["value"] for r in doc["rows"]] == VALUES and [r["meets_slo"] for r in doc["rows"]] == [
        False,
        True,
        False,
        False,
    ]
    assert doc["rows"][0]["tpot_ms_p99"] == pytest.approx(sweep.rows[0].mean("tpot_ms", "p99"))
    json.dumps(doc)  # plain JSON types only


def test_chart_is_self_contained_html(incident):
    _, _, sweep, d = incident
    path = save_chart(sweep, d / "sweep.html")
    html = path.read_text()
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert "<script src=" not in html.replace(" ", "") and "cdn.jsdelivr" not in html
    assert "p99 TPOT (ms)" in html and "What-if replay of incident" in html
    rows = chart_rows(sweep)
    assert len(rows) == len(VALUES) * 2 * len(SEEDS)
    r = next(x for x in rows if x["value"] == 512 and x["panel"] == "p99 TPOT (ms)" and x["seed"] == 1)
    assert r["ms"] == sweep.rows[1].per_seed[1]["tpot_ms"]["p99"] and r["status"] == "meets SLO"


@pytest.mark.slow
def test_cli_sweep_writes_table_and_chart(incident, tmp_path):
    db, _, _, d = incident
    chart = tmp_path / "c.html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "replay",
            "incident",
            "--db",
            str(db),
            "--seeds",
            "1",
            "--sweep",
            "max_num_batched_tokens=512,2048",
            "--slo",
            str(d / "slo.toml"),
            "--chart",
            str(chart),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["param"] == "max_num_batched_tokens" and doc["chart"] == str(chart) and chart.exists()
    assert [row["meets_slo"] for row in doc["rows"]] == [True, False]


def test_cli_sweep_refuses_an_option_it_would_replace_and_an_infeasible_value(incident):
    db = incident[0]

    def replay(*args):
        return run_cli("replay", "incident", "--db", str(db), "--seeds", "1", *args)

    # the sweep's values replaced --max-num-batched-tokens 512 without a word
    r = replay("--max-num-batched-tokens", "512", "--sweep", "max_num_batched_tokens=256,1024")
    assert r.returncode == 2 and r.stderr.startswith(
        "Error: --max-num-batched-tokens 512 and --sweep max_num_batched_tokens=256,1024 both set max_num_batched_tokens"
        "; put 512 among the sweep's values, or leave it out"
    ), r.stderr
    r = replay("--max-num-batched-tokens", "512", "--sweep", "max_num_batched_tokens=512,1024")
    assert r.returncode == 2 and "both set max_num_batched_tokens; leave it out" in r.stderr, r.stderr
    r = replay("--no-chunked-prefill", "--sweep", "chunked_prefill=true,false")
    assert r.returncode == 2 and r.stderr.startswith("Error: --no-chunked-prefill and --sweep"), r.stderr
    # a KV cache too small for the largest request: said of that value, before any replay runs
    r = replay("--sweep", "kv_capacity_tokens=2000,400000")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("Error: --sweep kv_capacity_tokens=2000: request ") and r.stderr.rstrip().endswith(
        "; leave 2000 out of the sweep"
    ), r.stderr


def test_parse_sweep():
    assert parse_sweep("max-num-seqs=8, 16,16,32") == ("max_num_seqs", [8, 16, 32])
    assert parse_sweep("chunked_prefill=on,false") == ("chunked_prefill", [True, False])
    assert parse_sweep("kv-block-size=1,16,128") == ("kv_block_size", [1, 16, 128])
    assert parse_sweep("admit_full_prompt=no,yes") == ("admit_full_prompt", [False, True])
    for bad in (
        "max_num_seqs",
        "max_num_seqs=",
        "max_num_seqs=8,x",
        "max_num_seqs=0",
        "foo=1",
        "admit_full_prompt=maybe",
    ):
        with pytest.raises(InputError):
            parse_sweep(bad)


def test_no_row_is_the_recording_when_another_setting_changed(incident):
    """--max-num-seqs 16 --sweep max_num_batched_tokens=...: the recorded chunk size's row runs with
    16 sequences, so it is not the recording; the header and the JSON name what every row changed."""
    db, cal, _, _ = incident
    con = store.open_for_reading(db)
    fixed = calibrate(con, "incident", {"max_num_seqs": 16}, noise="none")
    con.close()
    sweep = run_sweep(fixed, "max_num_batched_tokens", [1024, 2048], [0])
    assert sweep.recorded_value == 2048 and not sweep.is_recorded(2048)
    assert sweep.fixed_changes() == ["max_num_seqs=16"]
    text = sweep.format()
    assert "(as recorded)" not in text and "every row with max_num_seqs=16;" in text.splitlines()[0]
    assert [r["recorded"] for r in sweep.to_dict()["rows"]] == [False, False]
    assert sweep.to_dict()["fixed_changes"] == ["max_num_seqs=16"]
    # the sweep of the recording as it was still marks its recorded value
    plain = run_sweep(cal, "max_num_batched_tokens", [2048], [0])
    assert plain.fixed_changes() == [] and plain.is_recorded(2048)


def test_a_workload_file_name_stays_on_the_header_line(incident):
    """The header names the workload file every row replays; a newline in its name is shown escaped."""
    _, cal, _, _ = incident
    named = cal.with_workload(cal.workload, "w\nfake line.jsonl")
    text = run_sweep(named, "max_num_batched_tokens", [2048], [0]).format()
    assert "'workload w\\nfake line.jsonl';" in text.splitlines()[0]
    assert not any(line.startswith("fake line") for line in text.splitlines())


def test_slo_words_only_with_an_slo_file(incident, tmp_path):
    """Without --slo the footer spoke of SLOs met in every seed; an SLO file's name is shown escaped."""
    _, cal, sweep, d = incident
    bare = run_sweep(cal, "max_num_batched_tokens", [2048], [0]).format()
    assert "SLO" not in bare and "latencies in ms, mean over seeds" in bare
    assert "an SLO is met when it holds in every seed" in sweep.format()
    odd = tmp_path / "slo\nfake line.toml"
    odd.write_text((d / "slo.toml").read_text())
    text = run_sweep(cal, "max_num_batched_tokens", [2048], [0], load_slo(odd)).format()
    assert "fake line.toml" in text.splitlines()[0]
    assert not any(line.startswith("fake line") for line in text.splitlines())


def test_sweep_shows_the_observed_run_beside_the_row_replayed_as_recorded(incident):
    """The sweep's "(recorded)" row showed the replay at the recorded setting and nothing showed the
    recorded run, so a reader took replayed TTFT for observed. An "observed" row now carries the run's
    own statistics (checked here against numpy on the stored requests), in the text and the JSON."""
    db = incident[0]
    con = store.open_for_reading(db)
    ttft = con.execute(
        "select (t_first_token - t_arrival) * 1000 from requests where run_id = 'incident' and status = 'ok' "
        "and t_first_token is not null"
    ).fetchnumpy()
    con.close()
    ttft = np.sort(next(iter(ttft.values())))
    p50, p99 = np.percentile(ttft, 50), np.percentile(ttft, 99)
    args = ["replay", "incident", "--db", str(db), "--seeds", "1", "--sweep", "max_num_batched_tokens=512,2048"]
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["observed"]["ttft_ms_p50"] == pytest.approx(p50, rel=1e-9)
    assert doc["observed"]["ttft_ms_p99"] == pytest.approx(p99, rel=1e-9)
    assert doc["observed"]["output_tokens_per_s"] > 0
    recorded = next(row for row in doc["rows"] if row["recorded"])
    assert recorded["ttft_ms_p50"] != doc["observed"]["ttft_ms_p50"]  # a replay, not the recording
    text = run_cli(*args).stdout.splitlines()
    observed = next(line for line in text if line.split()[:1] == ["observed"])
    assert float(observed.split()[1]) == pytest.approx(p50, rel=1e-3)
    assert any(line.lstrip().startswith("2048 (as recorded)") for line in text), text
    assert any("their difference is the replay's own error" in line for line in text), text
