"""Fleet: per-run numbers equal summary's, fleet percentiles within the sketch's error of numpy over all
requests, and the odd replicas (a head-of-line incident, a slower GPU) ranked first and flagged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline import store
from pipeline.cli import cli
from pipeline.fleet import ALPHA, SIGNALS, fleet, sketch_quantile
from pipeline.ingest import ingest_paths
from pipeline.metrics import metric_stats

from ..vega import validate_vega_lite


def _replica(tmp, name: str, seed: int, burst: bool = False, slow_gpu: bool = False):
    from pipeline.sim.engine import Policy, simulate
    from pipeline.sim.model import IterationModel, NoiseModel
    from pipeline.sim.workload import add_burst, poisson_workload
    from pipeline.sim.writer import write_trace

    w = poisson_workload(400, 8, 300, 0.6, 120, 0.6, seed=seed)
    if burst:
        w = add_burst(w, 20.0, 12, 16000, 16, spread_s=1.0)
    model = IterationModel(
        t0_ms=6.8, a_ms_per_ctx=0.00025 * (2.0 if slow_gpu else 1.0), b_ms_per_prefill=0.032, c_ms_per_decode=0.0
    )
    pol = Policy(max_num_seqs=128, max_num_batched_tokens=2048)
    result = simulate(w, pol, model, NoiseModel(sigma=0.03, stall_rate=0.002, stall_ms_mean=40.0), seed=seed)
    return write_trace(
        result,
        tmp / f"{name}.jsonl",
        name,
        pol,
        model,
        NoiseModel(sigma=0.03, stall_rate=0.002, stall_ms_mean=40.0),
        model_name="meta-llama/Llama-3.1-8B",
        gpu="H100-SXM",
    )


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    files = [_replica(d, f"r{i}", 10 + i) for i in range(6)]
    files += [_replica(d, "hol", 30, burst=True), _replica(d, "slowgpu", 31, slow_gpu=True)]
    con = store.connect(d / "s.duckdb")
    ingest_paths(con, files)
    store.build_derived(con)
    runs = [r[0] for r in con.execute("select run_id from runs order by 1").fetchall()]
    con.close()
    res = CliRunner().invoke(cli, ["export", *runs, "--db", str(d / "s.duckdb"), "--lake", str(d / "lake")])
    assert res.exit_code == 0, res.output
    return d


def test_fleet_numbers(lake):
    out = fleet(lake / "lake", workers=2)
    con = store.connect(lake / "s.duckdb")
    by = {r["run_id"]: r for r in out["runs"]}
    assert set(by) == {f"r{i}" for i in range(6)} | {"hol", "slowgpu"}
    for run, rec in by.items():  # per run: exactly what summary says (its statistics, without the fit)
        s = metric_stats(con, run)
        for m in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"):
            assert rec[m]["p99"] == s[m]["p99"] and rec[m]["p50"] == s[m]["p50"]
    for m, table in (("ttft_ms", "request_latency"), ("tpot_ms", "request_latency"), ("itl_ms", "token_gaps")):
        status = "and status = 'ok'" if table == "request_latency" else ""
        allv = con.execute(f"select {m} from {table} where {m} is not null {status}").fetchnumpy()[m]
        assert out["fleet"][m]["count"] == len(allv)
        for q in (0.5, 0.9, 0.99):
            exact = np.quantile(allv, q)  # interpolated, as the SLOs and every summary define it
            got = out["fleet"][m][f"p{int(round(q * 100))}"]
            assert abs(got - exact) <= ALPHA * exact * 1.0001 + 1e-9, (m, q, got, exact)
    for m in ("ttft_ms", "itl_ms", "queue_ms", "iteration_ms"):  # merged moments: exact, not sketched
        from pipeline.audit.measure import SOURCES

        table, where = SOURCES[m]
        allv = con.execute(f"select {m} from {table} where {m} is not null and {where}").fetchnumpy()[m]
        f = out["fleet"][m]
        assert f["count"] == len(allv) and f["min"] == allv.min() and f["max"] == allv.max()
        assert f["mean"] == pytest.approx(allv.mean(), rel=1e-12) and f["std"] == pytest.approx(
            allv.std(ddof=1), rel=1e-9
        )
    # every signal is read from every run (a key summary does not write would leave one out silently)
    unexplained = np.array([by[r]["tail_shares"]["ttft"]["unexplained"] for r in sorted(by)], dtype=float)
    assert np.isfinite(unexplained).all()
    for rec in by.values():
        assert set(rec["z"]) == set(SIGNALS), rec["run_id"]
    med = np.median(unexplained)
    # the rule's spread, with its floor of 5 points of tail share (FLOORS)
    mad = max(1.4826 * np.median(np.abs(unexplained - med)), 0.05)
    if mad > 0:
        for run, v in zip(sorted(by), unexplained):
            assert by[run]["z"]["ttft_tail_unexplained"] == round((v - med) / mad, 3)
    ranked = [r["run_id"] for r in out["runs"]]
    assert ranked[0] in ("hol", "slowgpu") and set(ranked[:2]) == {"hol", "slowgpu"}
    assert "ttft_p99_ms" in by["hol"]["outlier"]
    assert "bandwidth_gbps" in by["slowgpu"]["outlier"]
    # the odd ones stand far apart; an ordinary replica's noisy p99 of 400 requests may reach z ~4
    # (the bandwidth's spread is at least 5% of the median: half the bandwidth is then z ~10)
    assert by["hol"]["z"]["ttft_p99_ms"] > 100 and by["slowgpu"]["z"]["bandwidth_gbps"] > 8
    bw = np.array([by[r]["effective_bandwidth_gbps"] for r in sorted(by)], dtype=float)
    scale = max(1.4826 * np.median(np.abs(bw - np.median(bw))), 0.05 * np.median(bw))
    assert by["slowgpu"]["z"]["bandwidth_gbps"] == round(
        (np.median(bw) - by["slowgpu"]["effective_bandwidth_gbps"]) / scale, 3
    )
    assert not any("bandwidth_gbps" in by[f"r{i}"]["outlier"] for i in range(6))


def test_fleet_cli_json_and_glob(lake):
    res = CliRunner().invoke(cli, ["fleet", str(lake / "lake"), "--runs", "r*", "--json", "--workers", "1"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert {r["run_id"] for r in out["runs"]} == {f"r{i}" for i in range(6)}
    from pipeline.metrics import METRICS

    assert set(out["fleet"]) == set(METRICS) and out["executor"] == "in process"
    assert {"p50", "p90", "p99", "p999", "count", "mean", "std", "min", "max"} == set(out["fleet"]["ttft_ms"])
    for r in out["runs"]:
        assert {"run_id", "ttft_ms", "tpot_ms", "e2e_ms", "itl_ms", "outlier", "z", "t0_ms"} <= set(r)
    from pipeline.cli import run_captured

    for pattern in ("", "x*"):  # an empty pattern (an unset variable) is named, not taken for none given
        code, text = run_captured("fleet", lake / "lake", "--runs", pattern, "--workers", "1")
        assert code == 2 and f"no runs matching --runs {pattern!r}" in text, text


@pytest.mark.long
def test_fleet_slo_junit_and_page(lake, tmp_path, string_channels):
    """--slo: each run's verdict is `audit`'s; the fleet-wide p99 is the merged sketch's, checked against the
    limit; exit 1 on a violation; --junit holds a testsuite per run and one for the fleet; --out links reports."""
    import xml.etree.ElementTree as ET

    from pipeline.cli import run_captured

    con = store.connect(lake / "s.duckdb")
    hol, slow = metric_stats(con, "hol")["ttft_ms"]["p99"], metric_stats(con, "slowgpu")["ttft_ms"]["p99"]
    assert hol > 2 * slow
    limit = (hol + slow) / 2
    slo = tmp_path / "slo.toml"
    slo.write_text(f"[slo]\nttft_ms.p99 = {limit}\ntpot_ms.mean = 1e6\n[goodput]\nttft_ms = {limit}\n")
    code, text = run_captured(
        "fleet",
        lake / "lake",
        "--runs",
        "*o*",
        "--workers",
        "1",
        "--slo",
        slo,
        "--json",
        "--junit",
        tmp_path / "j.xml",
        "--out",
        tmp_path / "page",
    )
    assert code == 1, text
    out = json.JSONDecoder().raw_decode(text)[0]  # stdout's JSON; the `Error:` line of the failed check follows
    verdicts = {r["run_id"]: r["slo"]["verdict"] for r in out["runs"]}
    assert verdicts == {"hol": "fail", "slowgpu": "pass"}
    for run in ("hol", "slowgpu"):  # the same verdict and checks as `audit`
        a = run_captured("audit", run, "--slo", slo, "--json", "--db", lake / "s.duckdb")[1]
        assert (
            json.JSONDecoder().raw_decode(a)[0]["checks"]
            == next(r for r in out["runs"] if r["run_id"] == run)["slo"]["checks"]
        )
    allv = con.execute(
        "select ttft_ms from request_latency where run_id in ('hol', 'slowgpu') and status = 'ok' "
        "and ttft_ms is not null"
    ).fetchnumpy()["ttft_ms"]
    fl = next(c for c in out["slo"]["fleet"]["checks"] if c["name"].startswith("ttft_ms.p99"))
    exact = np.quantile(allv, 0.99, method="lower")
    assert abs(fl["observed"] - exact) <= ALPHA * exact * 1.0001
    assert fl["status"] == ("pass" if fl["observed"] <= limit else "fail")
    good = con.execute(
        "select count(*) filter (where status = 'ok' and ttft_ms <= ?) / count(*) from request_latency "
        "where run_id in ('hol', 'slowgpu')",
        [limit],
    ).fetchone()[0]
    assert out["slo"]["fleet"]["goodput"]["attainment"] == pytest.approx(good, rel=1e-12)
    root = ET.parse(tmp_path / "j.xml").getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 3 and int(root.get("failures")) == sum(int(s.get("failures")) for s in suites) >= 1
    page = (tmp_path / "page" / "index.html").read_text()
    for r in out["runs"]:
        rel = Path(r["report"]).relative_to(tmp_path / "page").as_posix() + "/index.html"
        assert f'href="{rel}"' in page and (tmp_path / "page" / rel).is_file()
    # built without Altair's checks (pipeline.report.charts.VALIDATE): every chart is valid Vega-Lite
    specs = json.loads(re.search(r'id="tracelat-specs">(.*?)</script>', page, re.S).group(1))
    assert specs
    for spec in specs.values():
        validate_vega_lite(spec)
    assert not string_channels


@pytest.mark.parametrize("size", [20_000, 1_340, 7, 1])
def test_sketch_quantile_is_within_alpha(size):
    """Within ALPHA of the interpolated quantile (the definition SLOs use), also where the values
    near the rank lie far apart: few values from a heavy tail (the lower order statistic alone
    was 1.1% off a fleet's p99 of 1,340 values)."""
    rng = np.random.default_rng(size)
    x = rng.lognormal(3, 1.5, size)
    g = (1 + ALPHA) / (1 - ALPHA)
    ks, n = np.unique(np.ceil(np.log(x) / np.log(g)).astype(int), return_counts=True)
    counts = dict(zip(ks.tolist(), n.tolist()))
    for q in (0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 1.0):
        exact = np.quantile(x, q)
        assert abs(sketch_quantile(counts, q) - exact) <= ALPHA * exact * 1.0001, q


def test_sketch_quantile_interpolates_between_far_neighbours():
    # ten values: p99 lies 91% of the way from the 9th (10) to the 10th (1000)
    x = np.array([1.0] * 8 + [10.0, 1000.0])
    g = (1 + ALPHA) / (1 - ALPHA)
    ks, n = np.unique(np.ceil(np.log(x) / np.log(g)).astype(int), return_counts=True)
    est = sketch_quantile(dict(zip(ks.tolist(), n.tolist())), 0.99)
    assert est == pytest.approx(np.quantile(x, 0.99), rel=ALPHA)  # 910.0; the lower order statistic is 10


@pytest.fixture(scope="module")
def tiny_lake(tmp_path_factory):
    """Three small runs (the canonical fixture under three names), ingested into a lake."""
    from pipeline.cli import run_captured

    d = tmp_path_factory.mktemp("tiny")
    first, rest = (
        (Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl").read_text().split("\n", 1)
    )
    for name in ("a", "b", "c"):
        (d / f"{name}.jsonl").write_text(json.dumps({**json.loads(first), "run_id": name}) + "\n" + rest)
    code, out = run_captured("ingest", d / "a.jsonl", d / "b.jsonl", d / "c.jsonl", "--lake", d / "lake")
    assert code == 0, out
    return d / "lake"


def _comparable(out: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "cost"} for r in out["runs"]]


def test_fleet_on_ray_equals_in_process(tiny_lake):
    """On Ray (a local instance of 2 CPUs, or $TRACELAT_TEST_RAY's address) every run's record is the one
    computed in this process; skipped where Ray is not installed (pip install 'tracelat[ray]')."""
    import os

    pytest.importorskip("ray")
    mode = os.environ.get("TRACELAT_TEST_RAY", "local")
    on_ray = fleet(tiny_lake, ray=mode, workers=2)
    here = fleet(tiny_lake, workers=1)
    assert "Ray" in on_ray["executor"] and here["executor"] == "in process"
    assert _comparable(on_ray) == _comparable(here) and on_ray["fleet"] == here["fleet"]


@pytest.mark.long
def test_without_ray_local_falls_back_and_an_address_is_an_error(tiny_lake):
    import importlib.util

    from pipeline.cli import run_captured

    if importlib.util.find_spec("ray") is not None:
        pytest.skip("Ray is installed here; the fallback is for machines without it")
    out = fleet(tiny_lake, ray="local", workers=2)
    assert "Ray is not installed" in out["executor"] and len(out["runs"]) == 3
    code, text = run_captured("fleet", tiny_lake, "--ray", "ray://head:10001")
    assert code == 2 and "Ray is not installed" in text


@pytest.mark.parametrize("why", ["bad SLO file", "no such lake", "no runs"])
def test_fleet_exit_2_rewrites_a_stale_junit_file(tiny_lake, tmp_path, why):
    """A fleet audit that fails (exit 2) replaces the --junit file with an <error> naming the
    failure: CI must not show an earlier run's passing file."""
    import xml.etree.ElementTree as ET

    from pipeline.cli import run_captured

    junit = tmp_path / "fleet.xml"
    junit.write_text(
        '<testsuites tests="1" failures="0"><testsuite name="x" tests="1"><testcase name="ok"/></testsuite></testsuites>'
    )
    ok, bad = tmp_path / "ok.toml", tmp_path / "bad.toml"
    ok.write_text("[slo]\nttft_ms.p99 = 1e6\n")
    bad.write_text("[slo\n")
    args, fragment = {
        "bad SLO file": ([tiny_lake, "--slo", bad], "invalid TOML"),
        "no such lake": ([tmp_path / "nolake", "--slo", ok], "does not exist"),  # refused by click
        "no runs": ([tiny_lake, "--runs", "zz*", "--slo", ok], "no runs matching --runs 'zz*'"),
    }[why]
    code, text = run_captured("fleet", *args, "--workers", "1", "--junit", junit)
    assert code == 2 and fragment in text, text
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("1", "0", "1")
    (error,) = root.iter("error")
    assert error.get("message").startswith("tracelat fleet failed: ") and fragment in error.get("message")


def test_outlier_scale_has_a_floor_and_small_runs_are_left_out():
    """Runs that agree closely made any small difference an outlier: every t0 within 0.3% (MAD
    0.002 ms) flagged a 0.27% difference at z 4.6, and with no stalls on five runs one stall in
    2,000 steps on the sixth was z 4.8 (the MAD was 0)."""
    from pipeline.fleet import FLOORS, _robust_z, _signal

    t0 = [5.0005, 5.0138, 4.9985]
    assert max(_robust_z(t0, 1)) > 3.5  # the bare rule
    assert max(_robust_z(t0, 1, *FLOORS["t0_ms"])) < 1  # 0.27% against a 2% floor
    stalls = [0, 0, 0, 0, 0, 1 / 2000]
    assert _robust_z(stalls, 1)[-1] > 3.5
    assert _robust_z(stalls, 1, *FLOORS["stall_rate"])[-1] == pytest.approx(0.5)
    assert _robust_z([0, 0, 0, 0, 0, 0.01], 1, *FLOORS["stall_rate"])[-1] > 3.5  # 1% of steps: flagged
    big = {"requests": 500, "iterations": 5000, "t0_ms": 5.0, "ttft_ms": {"p99": 100.0}}
    small = {"requests": 8, "iterations": 6, "t0_ms": 9.0, "ttft_ms": {"p99": 900.0}}
    assert _signal("t0_ms", big) == 5.0 and _signal("t0_ms", small) is None
    assert _signal("ttft_p99_ms", big) == 100.0 and _signal("ttft_p99_ms", small) is None


def test_fleet_goodput_rates_leave_out_runs_without_requests(tmp_path):
    """A steps-only run (a TensorRT-LLM iteration log) in the fleet made the fleet's request goodput
    "cannot be evaluated: the run has no requests", while the attainment left it out. The rates
    are now the sums over the runs with requests, and the runs left out are named."""
    from pipeline.fleet_slo import fleet_audit
    from pipeline.slo import load_slo

    slo = tmp_path / "slo.toml"
    slo.write_text("[goodput]\nttft_ms = 2000\nmin_request_goodput_rps = 5.0\n")
    spec = load_slo(slo)

    def rec(run_id, goodput):
        return {
            "run_id": run_id,
            "slo": {"verdict": "pass", "exit_code": 0, "goodput": goodput, "failures": 0, "errors": 0},
        }

    g = {"requests": 100, "good_requests": 90, "request_goodput_rps": 3.0, "token_goodput_tps": 300.0}
    records = [rec("a", g), rec("b", {**g, "request_goodput_rps": 4.0}), rec("steps", {"requests": 0})]
    out = fleet_audit(spec, {}, records, 0.01)  # no [slo] limits: no sketch is read
    gp = out["fleet"]["goodput"]
    assert gp["request_goodput_rps"] == 7.0 and gp["attainment"] == 0.9 and gp["runs_without_requests"] == ["steps"]
    check = next(c for c in out["fleet"]["checks"] if "request goodput" in c["message"])
    assert check["status"] == "pass", check
    # a run whose audit could not compute its goodput (None) is no run without requests: the rate is unknown
    out = fleet_audit(spec, {}, [*records, rec("broken", None)], 0.01)
    gp = out["fleet"]["goodput"]
    assert gp["request_goodput_rps"] is None and gp["runs_without_requests"] == ["steps"]
