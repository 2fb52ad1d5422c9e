"""`tracelat fit`, `tracelat explain` and the summary sections through the real CLI; degraded inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline import store
from pipeline.fit import explain, get_or_fit
from pipeline.ingest import ingest_paths
from ..clirun import run_cli


def run(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args)


@pytest.fixture(scope="module")
def small_db(tmp_path_factory) -> tuple[str, object]:
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.workload import poisson_workload
    from pipeline.sim.writer import write_trace

    tmp = tmp_path_factory.mktemp("cli")
    model = IterationModel(t0_ms=5.0, a_ms_per_ctx=2e-4, b_ms_per_prefill=0.02, c_ms_per_decode=0.0)
    noise = NoiseModel(sigma=0.02, stall_rate=0.01, stall_ms_mean=40.0)
    policy = Policy(max_num_seqs=64, max_num_batched_tokens=1024)
    res = simulate(poisson_workload(400, 8, 300, 0.7, 100, 0.7, seed=4), policy, model, noise, seed=4)
    trace = write_trace(res, tmp / "small.jsonl", "small", policy, model, noise, model_name="mistral-7b", gpu="l40s")
    db = str(tmp / "small.duckdb")
    assert run("ingest", str(trace), "--db", db).returncode == 0
    return db, model


@pytest.mark.long
def test_fit_json_and_text(small_db):
    db, model = small_db
    r = run("fit", "small", "--db", db, "--json", "--bootstrap", "50")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["t0_ms"] == pytest.approx(model.t0_ms, rel=0.03)
    assert d["a_ms_per_ctx"] == pytest.approx(model.a_ms_per_ctx, rel=0.05)
    assert d["hardware"]["model"] == "mistral-7b" and d["hardware"]["gpu"] == "l40s"
    kv = 2 * 32 * 8 * 128 * 2
    assert d["hardware"]["effective_bandwidth_gbps"] == pytest.approx(kv / (d["a_ms_per_ctx"] * 1e-3) / 1e9)
    assert [c["holds"] for c in d["claims"]][0] is True
    r = run("fit", "small", "--db", db, "--gpu", "cpu:50", "--bootstrap", "20")
    assert r.returncode == 0, r.stderr
    assert "GPU cpu x1" in r.stdout and "of peak 50 GB/s" in r.stdout and "iteration-time claims" in r.stdout
    # the one threshold serves two ratios: the line says which is which
    assert "r = log(measured/predicted) for stalls and log(measured/decode baseline) for prefill spikes" in r.stdout
    lim = d["stall_detection_limit_ms"]
    assert f"stalls shorter than {lim['median_step']:.3g} ms on a median step" in r.stdout
    # each phase's R² is shown without stalls too (with them it read 0.003 on a run whose fit was right)
    for name, ph in d["phases"].items():
        if "coef" in ph:
            line = next(x for x in r.stdout.splitlines() if x.strip().startswith(f"phase {name}:"))
            assert line.endswith(f"R² {ph['r2']:.3f} (without stalls {ph['r2_inliers']:.3f})"), line


def test_fit_errors_exit_2(small_db):
    db, _ = small_db
    r = run("fit", "small", "--db", db, "--gpu", "tpu-v9")
    assert r.returncode == 2 and r.stderr.startswith("Error: unknown GPU 'tpu-v9'")
    r = run("fit", "nosuch", "--db", db)
    assert r.returncode == 2 and "known runs: small" in r.stderr


@pytest.mark.long
def test_explain_and_summary(small_db):
    db, _ = small_db
    r = run("explain", "small", "--metric", "tpot", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)
    assert sum(p["share"] for p in e["parts"]) == pytest.approx(1.0)
    assert e["largest"] == e["parts"][0]["part"]
    r = run("explain", "small", "--metric", "ttft", "--from", "10", "--to", "20", "--db", db)
    assert r.returncode == 0, r.stderr
    assert "requests arriving +10.000 s .. +20.000 s" in r.stdout and "largest:" in r.stdout
    r = run("explain", "small", "--from", "14:03", "--db", db)
    assert r.returncode == 2 and "not unix time" in r.stderr
    s = json.loads(run("summary", "small", "--db", db, "--json").stdout)
    assert set(s["fit"]) >= {
        "t0_ms",
        "ms_per_1k_context_tokens",
        "ms_per_1k_prefill_tokens",
        "r2",
        "mape",
        "effective_bandwidth_gbps",
        "bandwidth_fraction_of_peak",
    }
    assert set(s["spikes"]) == {"count", "prefill", "preemption", "unexplained", "stall_detection_limit_ms"}
    fit = json.loads(run("fit", "small", "--db", db, "--json").stdout)
    lim = s["spikes"]["stall_detection_limit_ms"]
    assert lim == fit["stall_detection_limit_ms"] and 0 < lim["median_step"] < lim["p90_step"]
    assert set(s["tail"]) == {"ttft", "tpot", "e2e"}
    assert sum(s["tail"]["e2e"].values()) == pytest.approx(1.0)


def _ingest(tmp: Path, lines: list[dict]):
    path = tmp / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    con = store.connect(tmp / "t.duckdb")
    ingest_paths(con, [path])
    store.build_derived(con)
    return con


def test_steps_without_context_say_so(tmp_path):
    steps = [
        {
            "kind": "iteration",
            "iter": k,
            "t_start": k * 0.01,
            "t_end": k * 0.01 + (2 + 0.01 * (k % 7) * 10) / 1000,
            "prefill_tokens": (k % 7) * 10,
            "decode_tokens": 4,
        }
        for k in range(60)
    ]
    con = _ingest(tmp_path, [{"kind": "run", "run_id": "noctx", "model": "vllm-cpu-tiny", "gpu": "cpu"}] + steps)
    f = get_or_fit(con, "noctx")
    assert f.a_ms_per_ctx is None and f.c_ms_per_decode is None
    assert f.t0_ms == pytest.approx(2.0, rel=1e-6) and f.b_ms_per_prefill == pytest.approx(0.01, rel=1e-6)
    assert any("context_tokens is not recorded" in s for s in f.statements)
    assert any("decode_tokens never varies (always 4" in s for s in f.statements)
    assert any("give it with --bandwidth-gbps" in s for s in f.statements)
    assert f.claims[0]["holds"] is None and f.claims[1]["holds"] is None


def test_requests_without_steps_are_unattributed(tmp_path):
    reqs = [
        {
            "kind": "request",
            "req_id": f"q{i}",
            "t_arrival": i,
            "t_scheduled": i + 0.1,
            "t_first_token": i + 0.2,
            "t_finish": i + 1.0 + i / 100,
            "prompt_tokens": 10,
            "output_tokens": 9,
            "status": "ok",
        }
        for i in range(50)
    ]
    con = _ingest(tmp_path, [{"kind": "run", "run_id": "client"}] + reqs)
    f = get_or_fit(con, "client")
    assert f.n_iterations == 0 and any("no steps" in s for s in f.statements)
    e = explain(con, "client", "e2e")
    assert [p["part"] for p in e["parts"] if p["share"]] == ["unattributed"]
    assert any("not covered by fitted steps" in s for s in e["statements"])


@pytest.mark.long
def test_fit_fdr_option_and_deprecated_k(small_db):
    db, _ = small_db
    r = run("fit", "small", "--db", db, "--json", "--bootstrap", "20", "--fdr", "0.01")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    fd = d["stall_fdr"]
    assert fd["q"] == 0.01 and fd["flagged"] == d["stall_ms"]["count"]
    assert fd["expected_false"] <= 0.01 * max(fd["flagged"], 1) * (1 + 1e-9)
    # the stored k is the cut in robust sigmas: the same threshold written two ways
    assert d["log_center"] + d["k"] * d["residual_log_sigma"] == pytest.approx(fd["threshold"], rel=1e-9)
    ex = d["extended"]
    assert set(ex["cv"]) == {"memory_bound", "extended"}
    assert all(set(v) == {"mape_pct", "p90_abs_ms"} for v in ex["cv"].values())
    text = run("fit", "small", "--db", db, "--bootstrap", "20").stdout
    assert "false-discovery rate 0.05" in text and "held-out steps" in text and "memory-bound" in text
    r = run("fit", "small", "--db", db, "--json", "--bootstrap", "20", "--k", "4")
    assert r.returncode == 0 and "--k is deprecated" in r.stderr
    d = json.loads(r.stdout)
    assert d["k"] == 4 and d["stall_fdr"] is None
    # both: two rules, and --fdr was dropped without a word
    r = run("fit", "small", "--db", db, "--bootstrap", "20", "--k", "3.5", "--fdr", "0.01")
    assert r.returncode == 2 and "--k 3.5 and --fdr 0.01 are two stall rules; give one" in r.stderr, r.stderr


def test_given_figures_describe_a_gpu_the_catalogue_lacks(tmp_path):
    """--bandwidth-gbps / --peak-tflops on a run whose GPU is not catalogued (an RTX 4090) or not
    named: the figures are used (they were dropped, with no bandwidth fraction, floor or roofline)."""
    from pipeline.catalog import HardwareSpec, find_model
    from pipeline.fit import fit_run

    steps = [
        {
            "kind": "iteration",
            "iter": k,
            "t_start": k * 0.05,
            "t_end": k * 0.05 + (6 + 0.0002 * (1000 + 37 * k) + 0.02 * (k % 5) * 64) / 1000,
            "context_tokens": 1000 + 37 * k,
            "prefill_tokens": (k % 5) * 64,
            "decode_tokens": 8,
        }
        for k in range(200)
    ]
    run = {"kind": "run", "run_id": "rtx", "model": "llama-3.1-8b", "gpu": "NVIDIA GeForce RTX 4090"}
    con = _ingest(tmp_path, [run] + steps)
    hw = fit_run(con, "rtx", HardwareSpec(bandwidth_gbps=1008.0, tflops=165.2), n_boot=20).to_dict()["hardware"]
    spec = find_model("llama-3.1-8b")
    assert hw["gpu"] == "NVIDIA GeForce RTX 4090" and hw["peak_bandwidth_gbps"] == 1008.0
    assert hw["weight_floor_ms"] == pytest.approx(spec.weight_bytes("bf16") / 1008e9 * 1e3)
    assert hw["bandwidth_fraction_of_peak"] == pytest.approx(hw["effective_bandwidth_gbps"] / 1008.0)
    assert hw["prefill_roofline_ms_per_token"] == pytest.approx(2 * spec.active_b * 1e9 / 165.2e12 * 1e3)
    # a run that names no GPU at all: the same figures, under a name that says where they came from
    con.execute("update runs set gpu = null where run_id = 'rtx'")
    r = fit_run(con, "rtx", HardwareSpec(bandwidth_gbps=1008.0), n_boot=20).to_dict()
    assert r["hardware"]["gpu"] == "user-given" and r["hardware"]["peak_bandwidth_gbps"] == 1008.0
    assert "the run names no GPU: its figures are the ones given (--bandwidth-gbps, --peak-tflops)" in r["statements"]


def test_fit_text_of_steps_known_only_by_duration(tmp_path):
    """Steps with dur_ms and no t_start/t_end (legal canonical input): `tracelat fit` printed its
    spikes with `at +{t_offset_s:.3f} s` and crashed on the None (internal error, exit 2)."""
    from pipeline.cli import run_captured

    steps = [
        {
            "kind": "iteration",
            "iter": k,
            "dur_ms": 6 + 0.00005 * (1000 + 30 * k) + (0.03 * 512 if k % 10 == 0 else 0) + 0.01 * (k % 3),
            "context_tokens": 1000 + 30 * k,
            "prefill_tokens": 512 if k % 10 == 0 else 0,
            "decode_tokens": 8,
        }
        for k in range(200)
    ]
    _ingest(tmp_path, [{"kind": "run", "run_id": "dur"}] + steps).close()
    db = tmp_path / "t.duckdb"
    code, text = run_captured("fit", "dur", "--db", db, "--bootstrap", "20")
    assert code == 0, text
    code, js = run_captured("fit", "dur", "--db", db, "--bootstrap", "20", "--json")
    spikes = json.loads(js)["top_spikes"]
    assert spikes and all(s["t_offset_s"] is None for s in spikes)
    for s in spikes[:5]:
        line = (
            f"  iter {s['iter']}: {s['iteration_ms']:.4g} ms vs predicted {s['predicted_ms']:.4g} ms "
            f"(prefill {s['prefill_tokens']} tokens) -> {s['spike_cause']}"
        )
        assert line in text.splitlines(), line


@pytest.mark.long
def test_summary_and_report_keep_the_hardware_fit_was_given(tmp_path):
    """`fit RUN --model ... --gpu ...` gave a bandwidth and a weight floor, but summary and report
    (which have no such options) re-assembled the stored fit from the run's own names and showed
    null: for a run whose model or GPU the catalogue lacks, those fields were always empty."""
    trace, db = tmp_path / "base.jsonl", str(tmp_path / "hw.duckdb")
    assert run("simulate", "--requests", "200", "--rate", "8", "--seed", "1", "--out", str(trace)).returncode == 0
    assert run("ingest", str(trace), "--db", db).returncode == 0

    def figures():
        r = run("summary", "base", "--db", db, "--json")
        assert r.returncode == 0, r.stderr
        f = json.loads(r.stdout)["fit"]
        return f["effective_bandwidth_gbps"], f["weight_floor_ms"]

    assert figures() == (None, None)
    r = run("fit", "base", "--db", db, "--json", "--bootstrap", "20", "--model", "llama-3.1-8b", "--gpu", "h100")
    assert r.returncode == 0, r.stderr
    fitted = json.loads(r.stdout)["hardware"]
    bw, floor = figures()
    assert bw == pytest.approx(fitted["effective_bandwidth_gbps"], rel=1e-12) and bw > 0
    assert floor == pytest.approx(fitted["weight_floor_ms"], rel=1e-12)
    # a fit without options goes back to the run's own names
    assert run("fit", "base", "--db", db, "--bootstrap", "20").returncode == 0
    assert figures() == (None, None)


@pytest.mark.long
def test_a_relative_config_path_is_kept_as_the_file_it_named(tmp_path):
    """`fit --config config.json` kept the path as typed: a summary run from another folder could not
    find it and dropped every option fit was given (--gpu too), without a word."""
    import os
    import subprocess
    import sys

    from .test_catalog import _llama_config

    trace, db = tmp_path / "base.jsonl", str(tmp_path / "hw.duckdb")
    assert run("simulate", "--requests", "200", "--rate", "8", "--seed", "1", "--out", str(trace)).returncode == 0
    assert run("ingest", str(trace), "--db", db).returncode == 0
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps(_llama_config()))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}

    def cli(*args, cwd):
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env, capture_output=True, text=True
        )

    r = cli("fit", "base", "--db", db, "--bootstrap", "20", "--config", "config.json", "--gpu", "h100", cwd=cfg)
    assert r.returncode == 0, r.stderr
    r = cli("summary", "base", "--db", db, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fit"]["weight_floor_ms"] is not None
