"""Canonical trace and truth files written from a simulation, and the simulate command."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline import __version__
from pipeline.sim import (
    NO_NOISE,
    IterationModel,
    NoiseModel,
    Policy,
    WorkloadSpec,
    poisson_workload,
    run_simulation,
    simulate,
    token_times,
)
from pipeline.sim.writer import TRACE_ITERATION_FIELDS, write_trace, write_truth

MODEL = IterationModel()
POLICY = Policy(max_num_seqs=16, max_num_batched_tokens=512, kv_capacity_tokens=5000)


def read_jsonl(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def result():
    w = poisson_workload(80, 30.0, 300, 0.8, 30, 0.8, seed=1)
    return simulate(w, POLICY, MODEL, NoiseModel(sigma=0.05, stall_rate=0.05), seed=3)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_trace_round_trips_exactly(tmp_path, result, name):
    path = write_trace(result, tmp_path / name, "r1", POLICY, MODEL, NO_NOISE, {"requests": 80})
    recs = read_jsonl(path)
    run, its, reqs = recs[0], recs[1 : 1 + result.n_iterations], recs[1 + result.n_iterations :]
    assert run["kind"] == "run" and run["run_id"] == "r1" and run["engine"] == "tracelat-sim"
    assert run["engine_version"] == __version__ and run["clock"] == "monotonic"
    assert run["meta"]["simulated"] is True and run["meta"]["max_num_seqs"] == 16
    assert run["meta"]["kv_capacity_tokens"] == 5000 and run["meta"]["chunked_prefill"] is True
    assert [r["kind"] for r in its] == ["iteration"] * result.n_iterations
    assert list(its[0]) == ["kind", *TRACE_ITERATION_FIELDS]
    for f in TRACE_ITERATION_FIELDS:
        assert [r[f] for r in its] == result.iterations[f].tolist(), f
    assert len(reqs) == result.n_requests and all(r["kind"] == "request" for r in reqs)
    tt = token_times(result)
    for i, r in enumerate(reqs):
        assert r["req_id"] == str(result.requests["req_id"][i]) and r["status"] == "ok"
        assert r["t_first_token"] == result.requests["t_first_token"][i]
        assert r["token_times"] == tt[i].tolist()
        assert r["preemptions"] == result.requests["preemptions"][i]
    assert sum(r["preemptions"] for r in reqs) > 0


def test_no_token_times_and_nulls_for_unfinished(tmp_path):
    w = poisson_workload(50, 30.0, 300, 0.8, 30, 0.8, seed=1)
    res = simulate(w, POLICY, MODEL, NO_NOISE, seed=0, max_iterations=40)
    recs = read_jsonl(
        write_trace(res, tmp_path / "t.jsonl", "r", POLICY, MODEL, NO_NOISE, None, with_token_times=False)
    )
    reqs = [r for r in recs if r["kind"] == "request"]
    assert all("token_times" not in r for r in reqs)
    aborted = [r for r in reqs if r["status"] == "aborted"]
    assert aborted and all(r["t_finish"] is None for r in aborted)


def test_truth_lists_exactly_the_stalls(tmp_path):
    w = poisson_workload(200, 30.0, 200, 0.8, 40, 0.8, seed=4)
    noise = NoiseModel(sigma=0.0, stall_rate=0.03, stall_ms_mean=40.0)
    res = simulate(w, POLICY, MODEL, noise, seed=5)
    truth = json.loads(
        write_truth(tmp_path / "t.truth.json", res, "r", POLICY, MODEL, noise, 5, {"requests": 200}).read_text()
    )
    it = res.iterations
    slow = np.flatnonzero((it["t_end"] - it["t_start"]) * 1000 - it["base_ms"] > 1e-6)
    assert [s["iter"] for s in truth["stalls"]] == slow.tolist() and len(slow) > 3
    for s in truth["stalls"]:
        k = s["iter"]
        assert s["t_start"] == it["t_start"][k]
        assert abs((it["t_end"][k] - it["t_start"][k]) * 1000 - it["base_ms"][k] - s["stall_ms"]) < 1e-6
    assert truth["seed"] == 5 and truth["policy"]["kv_capacity_tokens"] == 5000
    assert truth["model"]["t0_ms"] == 5.0 and truth["noise"]["stall_rate"] == 0.03
    assert truth["result"]["iterations"] == res.n_iterations


def test_run_simulation_sizes_the_workload_for_iterations(tmp_path):
    run = run_simulation(tmp_path / "x.jsonl.gz", spec=WorkloadSpec(rate_rps=20.0), iterations=3000, seed=1)
    assert run.result.n_iterations == 3000
    assert run.truth_path == tmp_path / "x.truth.json" and run.run_id == "x"
    assert sum(1 for r in read_jsonl(run.trace_path) if r["kind"] == "iteration") == 3000


def test_simulate_command(tmp_path):
    from pipeline.commands.simulate import simulate as cmd

    out = tmp_path / "demo.jsonl"
    args = [
        "--out",
        str(out),
        "--requests",
        "60",
        "--rate",
        "20",
        "--stall-rate",
        "0.05",
        "--seed",
        "3",
        "--burst-at",
        "1.0",
        "--burst-count",
        "3",
        "--burst-prompt-tokens",
        "3000",
        "--max-num-seqs",
        "32",
        "--kv-capacity-tokens",
        "50000",
        "--no-chunked-prefill",
        "--max-num-batched-tokens",
        "4096",
    ]
    res = CliRunner().invoke(cmd, args)
    assert res.exit_code == 0, res.output
    assert "iterations, 63 requests (63 finished)" in res.output and str(out) in res.output
    recs = read_jsonl(out)
    assert recs[0]["meta"]["chunked_prefill"] is False and recs[0]["meta"]["max_num_seqs"] == 32
    assert sum(r["kind"] == "request" for r in recs) == 63
    truth = json.loads((tmp_path / "demo.truth.json").read_text())
    assert truth["workload"]["spec"]["burst_count"] == 3 and truth["seed"] == 3
    again = CliRunner().invoke(cmd, [*args[:1], str(tmp_path / "again.jsonl"), *args[2:]])
    assert again.exit_code == 0
    assert (tmp_path / "again.jsonl").read_text().split("\n", 1)[1] == out.read_text().split("\n", 1)[1]


def test_simulate_command_usage_errors(tmp_path):
    from pipeline.commands.simulate import simulate as cmd

    res = CliRunner().invoke(
        cmd, ["--out", str(tmp_path / "x.jsonl"), "--max-num-seqs", "999", "--max-num-batched-tokens", "100"]
    )
    assert res.exit_code == 2 and "max_num_batched_tokens" in res.output
    bad = tmp_path / "bad.csv"
    bad.write_text("t_arrival,prompt_tokens,output_tokens\n0,x,1\n")
    res = CliRunner().invoke(cmd, ["--out", str(tmp_path / "x.jsonl"), "--lengths-file", str(bad)])
    assert res.exit_code != 0 and "bad.csv:2" in str(res.exception)
    for flag in ("--requests", "--iterations"):  # an empty trace is never what was meant
        res = CliRunner().invoke(cmd, ["--out", str(tmp_path / "x.jsonl"), flag, "0"])
        assert res.exit_code == 2 and f"Invalid value for '{flag}'" in res.output


def test_lengths_file_refuses_the_synthetic_options_it_would_ignore(tmp_path):
    from pipeline.commands.simulate import simulate as cmd

    lengths = tmp_path / "w.csv"
    lengths.write_text("t_arrival,prompt_tokens,output_tokens\n0,100,10\n0.5,200,20\n2.0,50,5\n")
    out = tmp_path / "lf.jsonl"
    res = CliRunner().invoke(
        cmd, ["--out", str(out), "--lengths-file", str(lengths), "--rate", "1", "--prompt-mean", "9"]
    )
    assert res.exit_code == 2 and "--rate, --prompt-mean shape a synthetic workload" in res.output
    assert not out.exists()
    res = CliRunner().invoke(cmd, ["--out", str(out), "--lengths-file", str(lengths), "--seed", "3"])
    assert res.exit_code == 0, res.output
    spec = json.loads(out.with_name("lf.truth.json").read_text())["workload"]["spec"]
    # the truth file names only what made the workload: the file, not a rate it never used
    assert spec["lengths_file"] == str(lengths) and "rate_rps" not in spec and "prompt_mean" not in spec
    arrivals = [json.loads(x)["t_arrival"] for x in out.read_text().splitlines() if '"kind":"request"' in x]
    assert sorted(arrivals) == pytest.approx([0.0, 0.5, 2.0])


def test_simulate_command_kv_blocks(tmp_path):
    from pipeline.commands.simulate import simulate as cmd

    out = tmp_path / "blocks.jsonl"
    args = [
        "--out",
        str(out),
        "--requests",
        "80",
        "--rate",
        "40",
        "--prompt-mean",
        "300",
        "--output-mean",
        "30",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "256",
        "--kv-capacity-tokens",
        "2000",
        "--kv-block-size",
        "128",
        "--seed",
        "1",
    ]
    res = CliRunner().invoke(cmd, args)
    assert res.exit_code == 0, res.output
    recs = read_jsonl(out)
    assert recs[0]["meta"]["kv_block_size"] == 128 and recs[0]["meta"]["kv_capacity_tokens"] == 2000
    usage = np.array([r["kv_usage"] for r in recs if r["kind"] == "iteration"])
    held = usage * (2000 // 128)  # 15 blocks: usage is whole blocks over 15
    assert usage.max() == 1.0 and np.allclose(held, np.round(held), atol=1e-9)
    res = CliRunner().invoke(
        cmd, ["--out", str(tmp_path / "x.jsonl"), "--kv-capacity-tokens", "100", "--kv-block-size", "128"]
    )
    assert res.exit_code == 2 and "kv_block_size" in res.output


def test_burst_options_without_burst_at_are_refused(tmp_path):
    """--burst-count & co shape the burst --burst-at injects: without it they did nothing, silently."""
    from pipeline.commands.simulate import simulate as cmd

    out = tmp_path / "b.jsonl"
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--burst-count", "40"])
    assert res.exit_code == 2 and not out.exists()
    assert (
        "Error: --burst-count shapes the burst that --burst-at injects; without --burst-at there is no burst. "
        "Add --burst-at SECONDS, or leave it out" in res.output
    )
    res = CliRunner().invoke(cmd, ["--out", str(out), "--burst-spread", "2", "--burst-prompt-tokens", "100"])
    assert res.exit_code == 2 and "--burst-prompt-tokens, --burst-spread shape the burst" in res.output
    assert "leave them out" in res.output
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--burst-at", "0.5", "--burst-count", "4"])
    assert res.exit_code == 0, res.output
    assert "24 requests (24 finished)" in res.output


def test_stall_ms_without_a_stall_rate_is_refused(tmp_path):
    """--stall-ms sizes the stalls --stall-rate injects: at the default rate of 0 it did nothing, silently."""
    from pipeline.commands.simulate import simulate as cmd

    out = tmp_path / "s.jsonl"
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--stall-ms", "500"])
    assert res.exit_code == 2 and not out.exists()
    assert (
        "Error: --stall-ms sizes the stalls that --stall-rate injects; with a stall rate of 0 (the default) none "
        "is injected. Add --stall-rate P (a probability per step, e.g. 0.001), or leave --stall-ms out"
    ) in " ".join(res.output.split())
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--stall-rate", "0.5", "--stall-ms", "500"])
    assert res.exit_code == 0, res.output
    truth = json.loads(out.with_name("s.truth.json").read_text())
    assert truth["noise"]["stall_ms_mean"] == 500.0 and truth["noise"]["stall_rate"] == 0.5
    # a rate of 0 typed out is a sweep's first point, not a forgotten option
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--stall-rate", "0", "--stall-ms", "500"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.with_name("s.truth.json").read_text())["noise"]["stall_rate"] == 0.0


def test_noise_df_without_the_t_law_is_refused(tmp_path):
    """--noise-df is the t law's: with the default log-normal noise it did nothing, silently."""
    from pipeline.commands.simulate import simulate as cmd

    out = tmp_path / "n.jsonl"
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--noise-df", "5"])
    assert res.exit_code == 2 and not out.exists()
    assert (
        "Error: --noise-df is the degrees of freedom of the t law; the noise law is lognormal. "
        "Add --noise-law t, or leave --noise-df out" in res.output
    )
    res = CliRunner().invoke(cmd, ["--out", str(out), "--requests", "20", "--noise-law", "t", "--noise-df", "5"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.with_name("n.truth.json").read_text())["noise"]["df"] == 5.0
