"""Acceptance: replaying a simulated run with its true policy reproduces its latencies; the CLI end to end."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.replay import calibrate, compare

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"
SEEDS = [0, 1, 2, 3]


def run(*args: str) -> subprocess.CompletedProcess:
    """The CLI in this process (a subprocess per call cost more than the replays), stdout and stderr apart."""
    from pipeline.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def validation(steady_db):
    con = store.open_for_reading(steady_db)
    cmp = compare(con, calibrate(con, "steady"), SEEDS)
    con.close()
    return cmp


@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms"])
@pytest.mark.parametrize("stat,tolerance", [("p50", 0.05), ("p99", 0.10)])
@pytest.mark.long
def test_replay_with_true_policy_reproduces_the_run(validation, metric, stat, tolerance):
    """Replay acceptance (docs/replay.md, "How well it works"): p50 within 5 %, p99 within 10 %, in the mean and in every seed."""
    row = next(r for r in validation.rows() if r["metric"] == metric and r["stat"] == stat)
    per_seed = np.array([s[metric][stat] for s in validation.replays])
    errors = per_seed / row["observed"] - 1
    assert abs(row["rel_error"]) < tolerance, row
    assert np.all(np.abs(errors) < tolerance), errors
    assert row["rel_error"] == pytest.approx(per_seed.mean() / row["observed"] - 1, rel=1e-9)


def test_observed_column_is_the_store_and_throughput_matches(validation, steady_db):
    con = store.open_for_reading(steady_db)
    ref = dict(con.execute("select metric, p99 from metric_stats where run_id = 'steady'").fetchall())
    rows = {(r["metric"], r["stat"]): r for r in validation.rows()}
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert rows[(m, "p99")]["observed"] == pytest.approx(ref[m], rel=1e-12)
    assert abs(rows[("throughput", "output_tokens_per_s")]["rel_error"]) < 0.01  # same work, same arrivals
    assert validation.mode == "validation"
    con.close()


def test_cli_writes_ingests_and_reports_replays(steady_db, tmp_path):
    out = tmp_path / "rep.jsonl"
    r = run("replay", "steady", "--db", str(steady_db), "--seeds", "2", "--out", str(out), "--ingest", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "validation" and doc["changed"] == {}
    assert doc["replay_run_ids"] == ["steady~replay~recorded-seed0", "steady~replay~recorded-seed1"]
    assert doc["written"] == [str(tmp_path / "rep-seed0.jsonl"), str(tmp_path / "rep-seed1.jsonl")]
    con = store.open_for_reading(steady_db)
    meta = json.loads(
        con.execute("select meta from runs where run_id = 'steady~replay~recorded-seed1'").fetchall()[0][0]
    )
    assert meta["replay"]["replay_of"] == "steady" and meta["replay"]["seed"] == 1
    assert meta["max_num_batched_tokens"] == 1024 and meta["simulated"] is True
    # the ingested replays, through the SQL pipeline, give the numbers the command reported
    rows = {(x["metric"], x["stat"]): x for x in doc["rows"]}
    for metric, stat in (("ttft_ms", "p50"), ("tpot_ms", "p99"), ("itl_ms", "p90")):
        sql = [
            con.execute(
                f"select {stat} from metric_stats where run_id = ? and metric = ?",
                [f"steady~replay~recorded-seed{k}", metric],
            ).fetchall()[0][0]
            for k in (0, 1)
        ]
        assert rows[(metric, stat)]["replay"] == pytest.approx(np.mean(sql), rel=1e-6)
        assert rows[(metric, stat)]["replay_min"] == pytest.approx(min(sql), rel=1e-6)
    n_recorded = con.execute("select count(*) from requests where run_id = 'steady'").fetchall()[0][0]
    n_replayed = con.execute(
        "select count(*) from requests where run_id = 'steady~replay~recorded-seed0' "
        "and (extra->>'recorded_status') = 'ok'"
    ).fetchall()[0][0]
    assert n_replayed == n_recorded
    con.close()


@pytest.mark.slow
def test_a_new_replay_replaces_the_stored_one_and_never_the_recording(steady_db, tmp_path):
    from pipeline.replay.trace import drop_replay

    args = ["replay", "steady", "--db", str(steady_db), "--seeds", "1", "--ingest"]
    assert run(*args, "--out", str(tmp_path / "a.jsonl")).returncode == 0
    r = run(*args, "--out", str(tmp_path / "b.jsonl.gz"), "--no-token-times")  # other file, other content
    assert r.returncode == 0, r.stderr
    con = store.open_for_reading(steady_db)
    q = "select count(*) from {} where run_id = 'steady~replay~recorded-seed0'"
    n_rec = con.execute("select count(*) from requests where run_id = 'steady'").fetchall()[0][0]
    assert con.execute(q.format("requests")).fetchall()[0][0] == n_rec
    assert con.execute(q.format("tokens")).fetchall()[0][0] == 0  # the second replay has no token times
    assert con.execute(q.format("runs")).fetchall()[0][0] == 1
    assert con.execute("select count(*) from rejects").fetchall()[0][0] == 0
    with pytest.raises(ValueError):
        drop_replay(con, "steady")
    assert drop_replay(con, "steady~replay~nothing-seed0") == 0
    con.close()


def test_cli_what_if_names_the_change(steady_db):
    r = run("replay", "steady", "--db", str(steady_db), "--seeds", "1", "--max-num-batched-tokens", "512")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("what-if replay of steady (max_num_batched_tokens=512; 1 seed(s)")
    # nothing was written: the names are given as what --out/--ingest would keep, not as runs
    assert "replays not kept (--out FILE and --ingest keep them as steady~replay~mbt512-seed0)" in r.stdout
    assert "replay runs:" not in r.stdout
    assert "ttft_ms p99" in r.stdout and "output_tokens_per_s" in r.stdout


def test_noise_none_describes_no_noise_and_no_stall(steady_db):
    """--noise none injects no stall: the header and the JSON give no stall size (they showed 50 ms)."""
    args = ("replay", "steady", "--db", str(steady_db), "--seeds", "1", "--noise", "none")
    r = run(*args)
    assert r.returncode == 0, r.stderr
    head = r.stdout.split("\n\n")[0].splitlines()
    assert head[0].endswith("1 seed(s), noise none)")
    assert "noise:  none (--noise none: the model's step time, no spread, no stalls)" in head
    assert not [line for line in head if "/step" in line]  # was "stalls 0/step of 50 ms"
    d = json.loads(run(*args, "--json").stdout)
    assert d["noise"] == {"sigma": 0.0, "stall_rate": 0.0, "stall_ms_mean": 0.0}
    assert d["calibration"]["noise_mode"] == "none"


def test_a_seed_with_no_noise_is_said_to_change_nothing(steady_db):
    """--seed K with --noise none gave the same replay under another run id, without a word."""
    base = ("replay", "steady", "--db", str(steady_db), "--seeds", "1", "--noise", "none", "--json")
    plain, seeded = json.loads(run(*base).stdout), json.loads(run(*base, "--seed", "3").stdout)
    said = "--noise none: the replay draws nothing at random, so --seed 3 replays what any seed does"
    assert any(n.startswith(said) for n in seeded["notes"]) and not any("--seed" in n for n in plain["notes"])
    assert seeded["replay_run_ids"] == ["steady~replay~recorded-nonoise-seed3"]
    assert [r["replay"] for r in seeded["rows"]] == [r["replay"] for r in plain["rows"]]


def test_noise_line_gives_a_stall_size_only_with_stalls(validation):
    from dataclasses import replace

    from pipeline.replay.validate import _noise_line
    from pipeline.sim import NoiseModel

    cal = validation.calibration
    assert cal.noise.stall_rate > 0 and _noise_line(cal).startswith(f"noise:  sigma={cal.noise.sigma:.3g}, stalls ")
    quiet = replace(cal, noise=NoiseModel(sigma=0.03, stall_rate=0.0, stall_ms_mean=0.0))  # a fit with no stall
    assert _noise_line(quiet) == "noise:  sigma=0.03, no stalls"


@pytest.mark.long
def test_no_token_times_needs_a_written_replay(steady_db):
    """--no-token-times shapes the traces --out writes or --ingest stores; alone it did nothing, silently."""
    db = str(steady_db)
    r = run("replay", "steady", "--db", db, "--seeds", "1", "--no-token-times")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "Error: --no-token-times leaves per-token times out of the replay traces that --out writes and --ingest "
        "stores; without either no trace is written, so it changes nothing: leave it out, or add --out FILE "
        "(or --ingest)"
    )
    r = run("replay", "steady", "--db", db, "--sweep", "max_num_seqs=8,16", "--no-token-times")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "Error: --no-token-times is for the traces --out writes; --sweep writes none: leave it out"
    )
    # --ingest without --out writes a scratch trace and stores it: there the option counts
    r = run("replay", "steady", "--db", db, "--seeds", "1", "--noise", "none", "--ingest", "--no-token-times")
    assert r.returncode == 0, r.stderr
    con = store.open_for_reading(steady_db)
    q = "select count(*) from {} where run_id = 'steady~replay~recorded-nonoise-seed0'"
    assert con.execute(q.format("requests")).fetchone()[0] > 0
    assert con.execute(q.format("tokens")).fetchone()[0] == 0
    con.close()


def test_cli_errors(tmp_path, steady_db):
    db = str(tmp_path / "t.duckdb")
    assert run("ingest", str(TINY), "--db", db).returncode == 0
    r = run("replay", "tiny", "--db", db)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "Error: run 'tiny' does not record kv_capacity_tokens in its metadata (runs.meta); "
        "pass --kv-capacity-tokens N to say what the engine used"
    )
    r = run("replay", "nope", "--db", db)
    assert r.returncode == 2 and "run 'nope' is not in the store" in r.stderr
    # a client's records alone: the missing steps first (scheduler options could not help)
    bench = Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "bench.json"
    assert run("ingest", str(bench), "--run-id", "client", "--db", db).returncode == 0
    r = run("replay", "client", "--db", db)
    assert r.returncode == 2 and r.stderr.startswith("Error: run 'client' has no steps with a duration"), r.stderr
    assert "ingest the server's log" in r.stderr
    r = run("replay", "steady", "--db", str(steady_db), "--chart", "x.html")
    assert r.returncode == 2 and "--chart goes with --sweep" in r.stderr
    r = run("replay", "steady", "--db", str(steady_db), "--slo", "x.toml")  # a single replay reads it for goodput
    assert r.returncode == 2 and "SLO file x.toml does not exist" in r.stderr
    r = run("replay", "steady", "--db", str(steady_db), "--sweep", "max_num_batched_tokens=256", "--out", "x.jsonl")
    assert r.returncode == 2 and "--sweep does not write traces" in r.stderr
    r = run("replay", "steady", "--db", str(steady_db), "--sweep", "block_size=16")
    assert r.returncode == 2 and "NAME one of max_num_seqs" in r.stderr


def test_calibration_report(validation):
    """Mean/p50/p90/p99 of TTFT, TPOT, ITL, E2E and queueing; bias from the per-seed values; verdict."""
    rep = validation.calibration_report()
    assert {(r["metric"], r["stat"]) for r in rep["rows"]} == {
        (m, s) for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms") for s in ("mean", "p50", "p90", "p99")
    }
    for r in rep["rows"]:
        per_seed = np.array([s[r["metric"]][r["stat"]] for s in validation.replays]) / r["observed"] - 1
        assert r["rel_error"] == pytest.approx(per_seed.mean(), rel=1e-9, abs=1e-12)
        assert (r["rel_error_min"], r["rel_error_max"]) == pytest.approx((per_seed.min(), per_seed.max()), rel=1e-9)
        expect = "over" if (per_seed > 0).all() else "under" if (per_seed < 0).all() else "mixed"
        assert r["bias"] == expect
        assert r["within_tol"] == (abs(per_seed.mean()) <= 0.10)
    # the simulated run replayed with its true model and policy: TPOT and E2E are trusted (the acceptance of docs/replay.md holds)
    assert {"tpot_ms", "e2e_ms"} <= set(rep["trusted"])
    for m in rep["trusted"]:
        assert all(abs(r["rel_error"]) <= 0.10 for r in rep["rows"] if r["metric"] == m)
    for x in rep["not_trusted"]:
        assert abs(x["rel_error"]) > 0.10 and f"{x['metric'].removesuffix('_ms')} ({x['stat']}" in rep["verdict"]
    assert rep["verdict"].startswith("trustworthy for what-ifs") and rep["verdict"] in validation.format()


def test_one_seed_shows_no_bias(validation):
    """With --seeds 1 every statistic's one seed was "every seed under" (or over), and the verdict
    said so: a bias needs two seeds to mean anything."""
    from dataclasses import replace

    one = replace(validation, seeds=validation.seeds[:1], replays=validation.replays[:1])
    rep = one.calibration_report()
    assert all(r["bias"] is None for r in rep["rows"]) and "every seed" not in rep["verdict"]
    text = one.format()
    assert "one seed shows no bias: use --seeds 3 or more" in text
    assert any(r["bias"] in ("over", "under") for r in validation.calibration_report()["rows"])  # 3 seeds: shown
