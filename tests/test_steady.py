"""Steady-state and peak throughput (pipeline/steady.py) on hand-built traces with a known load.

The traces are built here from a cumulative token count Λ(t): one engine step every 20 ms
(15 ms long) emits the tokens Λ gains by its end, and requests take those tokens 50 at a time.
The expected numbers are counted from the built token times with numpy, knowing where the
load holds; they share no code with the SQL that windows the run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import ingest, steady, store
from pipeline.summary import format_summary, summary

R = 200.0  # tokens/s while the load holds
STEP_S, DUR_S, PER_REQUEST = 0.02, 0.015, 50
T_END = 100.0  # 20 windows of 5 s: the run is shorter than min_windows * max_window_s


def ramp_hold_drain(t: np.ndarray) -> np.ndarray:
    """Λ(t): a linear ramp-up over 0..10 s, R from 10 to 90 s with a burst of 1.5 R over
    50..55 s, a linear drain over 90..100 s."""
    up = R * np.minimum(t, 10) ** 2 / 20
    hold = R * np.clip(t - 10, 0, 80) + 0.5 * R * np.clip(t - 50, 0, 5)
    d = np.clip(t - 90, 0, 10)
    return up + hold + R * (d - d**2 / 20)


def ramp_hold_short(t: np.ndarray) -> np.ndarray:
    """Λ(t) of a hold shorter than the ramps around it (the shape of a real vLLM run): a linear
    ramp-up over 0..35 s, R from 35 to 65 s, a linear drain over 65..100 s."""
    up = R * np.minimum(t, 35) ** 2 / 70
    d = np.clip(t - 65, 0, 35)
    return up + R * np.clip(t - 35, 0, 30) + R * (d - d**2 / 70)


def ramp_only(t: np.ndarray) -> np.ndarray:
    """Λ(t) of a load that rises all run long (rate R * t / 100): never steady."""
    return R * t**2 / 200


def build(
    lam, run_id: str, steps: bool = True, requests: bool = True, token_times: bool = True, per_request=PER_REQUEST
):
    """Canonical records of the trace, and its token times and steps for the expectations."""
    t_end = np.arange(1, round(T_END / STEP_S) + 1) / 50  # exact: k / 50 s
    t_start = np.maximum(t_end - DUR_S, 0.0)
    t_start[0] = 0.0  # the steps' span starts at 0 like the requests'
    cum = np.floor(lam(t_end) + 1e-6).astype(int)
    decode = np.diff(cum, prepend=0)
    times = np.repeat(t_end, decode)
    recs: list[dict] = [{"kind": "run", "run_id": run_id, "engine": "hand"}]
    if steps:
        recs += [
            {"kind": "iteration", "iter": i, "t_start": float(a), "t_end": float(b), "decode_tokens": int(d)}
            for i, (a, b, d) in enumerate(zip(t_start, t_end, decode))
        ]
    finish = []
    if requests:
        for j in range(0, len(times), per_request):
            tt = times[j : j + per_request]
            arrival = 0.0 if j == 0 else float(tt[0]) - 0.005
            rec = {
                "kind": "request",
                "req_id": f"r{j // per_request}",
                "t_arrival": arrival,
                "t_scheduled": arrival,
                "t_first_token": float(tt[0]),
                "t_finish": float(tt[-1]),
                "prompt_tokens": 16,
                "output_tokens": len(tt),
            }
            if token_times:
                rec["token_times"] = [float(x) for x in tt]
            recs.append(rec)
            finish.append(float(tt[-1]))
    return recs, times, (t_start, t_end, decode), np.array(finish)


# constant-rate Poisson loads: (requests, requests/s); short runs hold ~30 requests a window
POISSON = [(600, 10.0)] * 6 + [(1200, 2.0)] * 2


def poisson(run_id: str, n: int, rate: float, seed: int):
    """Requests arriving at random (Poisson, ``rate``/s), log-normal output lengths (cv ~0.9),
    50 ms to the first token and 10 ms a token after it: a load that holds from start to end."""
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))])
    out = np.maximum(1, rng.lognormal(np.log(100), 0.8, n).astype(int))
    recs: list[dict] = [{"kind": "run", "run_id": run_id, "engine": "hand"}]
    for j, (a, m) in enumerate(zip(arrival, out)):
        tt = a + 0.05 + 0.01 * np.arange(m)
        recs.append(
            {
                "kind": "request",
                "req_id": f"r{j}",
                "t_arrival": float(a),
                "t_first_token": float(tt[0]),
                "t_finish": float(tt[-1]),
                "prompt_tokens": 16,
                "output_tokens": int(m),
                "token_times": [float(x) for x in tt],
            }
        )
    # the load's rate: the requests' tokens over the arrivals' span (what the clients sent)
    return recs, out.sum() / arrival[-1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One store holding every variant (one ingest, one build of the derived tables)."""
    d = tmp_path_factory.mktemp("steady")
    variants = {
        "full": dict(lam=ramp_hold_drain),
        "requests_only": dict(lam=ramp_hold_drain, steps=False, token_times=False),
        "steps_only": dict(lam=ramp_hold_drain, requests=False),
        "ramp": dict(lam=ramp_only),
        # 5 tokens a request: 200 requests a window (counting noise 7%, the real run's 6-8%)
        "short_hold": dict(lam=ramp_hold_short, steps=False, per_request=5),
        "skewed": dict(lam=ramp_hold_drain, steps=False),
        "one": dict(lam=lambda t: np.minimum(t, 1) * PER_REQUEST, steps=False),
    }
    built = {}
    with (d / "trace.jsonl").open("w") as f:
        for run_id, kw in variants.items():
            recs, *rest = build(run_id=run_id, **kw)
            if run_id == "skewed":  # a clock jump: one request's last token and finish a day late
                last = recs[-1]
                last["token_times"][-1] += 86400.0
                last["t_finish"] += 86400.0
            f.writelines(json.dumps(r) + "\n" for r in recs)
            built[run_id] = rest
        for seed, (n, rate) in enumerate(POISSON):
            recs, truth = poisson(f"poisson{seed}", n, rate, seed)
            f.writelines(json.dumps(r) + "\n" for r in recs)
            built[f"poisson{seed}"] = truth
    con = store.connect(d / "s.duckdb")
    ingest.ingest_paths(con, [d / "trace.jsonl"])
    store.build_derived(con)
    yield con, built
    con.close()


@pytest.fixture(scope="module")
def summaries(runs):
    """The whole summary (it fits the model of each run: a second a run) of the two runs that need it."""
    con, _ = runs
    return {r: summary(con, r) for r in ("full", "ramp")}


def section(runs, run_id: str) -> dict:
    return steady.section(runs[0], run_id)["steady_state"]


def expected(times: np.ndarray, finish: np.ndarray) -> dict[str, float]:
    """The hold phase (10..90 s, burst included) counted directly; peak from 5 s bins."""
    hold = (times >= 10) & (times < 90)
    per_bin = np.histogram(times, bins=np.linspace(0, T_END, 21))[0]
    return {
        "steady": hold.sum() / 80,
        "requests": ((finish >= 10) & (finish < 90)).sum() / 80,
        "share": hold.sum() / len(times),
        "peak": per_bin.max() / 5,
        "whole": len(times) / T_END,
    }


@pytest.mark.long
def test_steady_throughput_is_the_hold_phase_rate(runs, summaries):
    times, _, finish = runs[1]["full"]
    exp = expected(times, finish)
    s = summaries["full"]
    st = s["steady_state"]
    assert st["reached"] and st["reason"] is None
    assert st["source"] == "token_times"
    assert (st["windows"], st["window_s"]) == (20, pytest.approx(5.0))
    assert st["steady_window_s"] == [pytest.approx(10.0), pytest.approx(90.0)]  # ramp and drain left out
    assert st["steady_output_tokens_per_s"] == pytest.approx(exp["steady"], rel=1e-12)
    assert st["steady_requests_per_s"] == pytest.approx(exp["requests"], rel=1e-12)
    assert st["steady_token_share"] == pytest.approx(exp["share"], rel=1e-12)
    assert st["peak_output_tokens_per_s"] == pytest.approx(exp["peak"], rel=1e-12)
    assert st["peak_output_tokens_per_s"] == pytest.approx(1.5 * R, rel=0.01)  # the burst
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(exp["whole"], rel=1e-12)
    assert st["peak_output_tokens_per_s"] > st["steady_output_tokens_per_s"] > s["throughput"]["output_tokens_per_s"]
    # the one-window burst is inside the steady window; the median of 3 windows smooths it out
    # of the band test (the peak, from the raw windows, still shows it)
    assert st["in_band_share"] == 1.0


def test_batch_over_iteration_time_identity(runs):
    """Effective batch size / iteration time, against the steps counted directly."""
    _, (t_start, t_end, decode), _ = runs[1]["full"]
    held = (t_end >= 10) & (t_end < 90)
    i = section(runs, "full")["identity"]
    busy_s = (t_end[held] - t_start[held]).sum()
    assert i["steps"] == held.sum()
    assert i["batch_decode_tokens_mean"] == pytest.approx(decode[held].mean(), rel=1e-12)
    assert i["iteration_ms_mean"] == pytest.approx(DUR_S * 1000, rel=1e-9)
    assert i["batch_per_iteration_tokens_per_s"] == pytest.approx(decode[held].sum() / busy_s, rel=1e-9)
    assert i["busy_share"] == pytest.approx(busy_s / 80, rel=1e-9)  # 15 ms of every 20 ms
    assert i["step_decode_tokens_per_s"] == pytest.approx(decode[held].sum() / 80, rel=1e-12)
    # the identity: what the steps produced per second of wall time = batch / iteration time * busy share
    assert i["step_decode_tokens_per_s"] == pytest.approx(i["batch_per_iteration_tokens_per_s"] * i["busy_share"])


def test_steps_only_run_counts_decode_tokens(runs):
    times, _, _ = runs[1]["steps_only"]
    st = section(runs, "steps_only")
    assert st["source"] == "iterations"
    assert st["steady_window_s"] == [pytest.approx(10.0), pytest.approx(90.0)]
    assert st["steady_output_tokens_per_s"] == pytest.approx(expected(times, times)["steady"], rel=1e-12)
    assert st["steady_requests_per_s"] is None  # no request records: no request rate


def test_requests_only_run_spreads_tokens_between_first_token_and_finish(runs):
    """Without token times or steps each request's tokens are spread evenly over its decode:
    the same steady window, the rate within a fraction of a percent of the hold's."""
    times, _, finish = runs[1]["requests_only"]
    exp = expected(times, finish)
    st = section(runs, "requests_only")
    assert st["source"] == "request_spans" and st["identity"] is None
    assert st["steady_window_s"] == [pytest.approx(10.0), pytest.approx(90.0)]
    assert st["steady_output_tokens_per_s"] == pytest.approx(exp["steady"], rel=0.005)
    assert st["steady_requests_per_s"] == pytest.approx(exp["requests"], rel=1e-12)
    assert st["peak_output_tokens_per_s"] == pytest.approx(exp["peak"], rel=0.02)


def test_a_run_that_only_ramps_up_has_no_steady_state(runs, summaries):
    times, _, _ = runs[1]["ramp"]
    s = summaries["ramp"]
    st = s["steady_state"]
    assert not st["reached"]
    assert st["steady_output_tokens_per_s"] is None and st["steady_window_s"] is None and st["identity"] is None
    # the top of a ramp is within the band over a stretch shorter than the ramp guard asks
    assert "never holds" in st["reason"] and "a ramp or a burst" in st["reason"]
    assert st["peak_output_tokens_per_s"] == pytest.approx(expected(times, times)["peak"], rel=1e-12)
    assert "steady state: none (" in format_summary(s)


def test_text_summary_shows_steady_and_peak(runs, summaries):
    exp = expected(runs[1]["full"][0], runs[1]["full"][2])
    text = format_summary(summaries["full"])
    line = next(x for x in text.splitlines() if x.startswith("steady state"))
    assert f"{exp['steady']:.1f} output tokens/s, {exp['requests']:.3f} requests/s" in line
    assert "over 10.0..90.0 s from the start" in line and f"peak {exp['peak']:.1f} tokens/s" in line
    assert "batch / iteration time:" in text


def test_report_table_lists_whole_run_steady_and_peak(summaries):
    from pipeline.report.render import _stats_table

    html = _stats_table(summaries["full"])
    assert "output tokens/s, whole run" in html and "output tokens/s, steady state" in html
    assert "output tokens/s, peak 5 s window" in html and "10.0 .. 90.0 (89% of the tokens)" in html
    html = _stats_table(summaries["ramp"])
    assert '<th class="l">steady state</th><td class="l">none: the rate is within ±' in html


def test_markdown_summary_shows_steady_and_peak(runs, summaries):
    from pipeline.report.markdown import summary_markdown

    exp = expected(runs[1]["full"][0], runs[1]["full"][2])
    line = next(x for x in summary_markdown(summaries["full"]).splitlines() if x.startswith("Steady state"))
    assert f"{exp['steady']:.1f} output tokens/s, {exp['requests']:.3f} requests/s over 10.0..90.0 s" in line
    assert f"peak {exp['peak']:.1f} output tokens/s (5 s window)" in line
    ramp = summary_markdown(summaries["ramp"])
    assert "Steady state: none (the rate is within ±" in ramp and "peak" in ramp


@pytest.mark.parametrize("seed", range(len(POISSON)))
def test_a_constant_poisson_load_is_steady_at_its_rate(runs, seed):
    """Counting noise (a window holds ~30 requests: ±25%) is not taken for bursts: the band
    widens with it, and the rate is that of the load."""
    st = section(runs, f"poisson{seed}")
    rate = runs[1][f"poisson{seed}"]
    assert st["reached"], st["reason"]
    assert st["steady_output_tokens_per_s"] == pytest.approx(rate, rel=0.05)
    assert st["steady_token_share"] > 0.75  # the whole run, less at most its ramp-up and drain
    # the noise estimate: 1 / sqrt(requests' worth of tokens a window), counted with numpy
    assert 0.1 < st["counting_noise"] < 0.35 and st["band"] == pytest.approx(2 * st["counting_noise"])


def test_a_hold_shorter_than_its_ramps_is_found(runs):
    """The level is the plateau's (the mode of the window rates), not the run's median, which
    lies on the ramps: the hold 35..65 s is found, its rate within a few % of R."""
    times, _, _ = runs[1]["short_hold"]
    st = section(runs, "short_hold")
    assert st["reached"], st["reason"]
    a, b = st["steady_window_s"]
    assert 30 - 1e-9 <= a <= 35 + 1e-9 and 65 - 1e-9 <= b <= 70 + 1e-9  # at most one ramp window each side
    held = ((times >= a) & (times < b)).sum() / (b - a)
    assert st["steady_output_tokens_per_s"] == pytest.approx(held, rel=1e-12)
    assert st["steady_output_tokens_per_s"] == pytest.approx(R, rel=0.03)
    assert st["level_tokens_per_s"] == pytest.approx(R, rel=0.02)


def test_a_clock_jump_is_named_and_the_busy_stretch_windowed(runs):
    """One token a day late stretches the run's span to 86,500 s: the windows cover the
    busy stretch instead, the note says why, and the hold is found as without the jump."""
    times, _, finish = runs[1]["skewed"]
    exp = expected(times, finish)
    st = section(runs, "skewed")
    assert "mostly empty" in st["span_note"] and "clock jump" in st["span_note"]
    # figures to the precision the spans have, the token left out counted, not rounded away
    assert st["span_note"].startswith("the run's 86500 s span")
    assert "all but 1 of its " in st["span_note"] and "0.0..100.0 s from the start" in st["span_note"]
    assert st["reached"], st["reason"]
    assert st["window_s"] < 10
    a, b = st["steady_window_s"]
    assert 5 <= a <= 10 and 90 <= b <= 95
    assert st["steady_output_tokens_per_s"] == pytest.approx(exp["steady"], rel=0.02)
    assert "note: the run's" in "\n".join(steady.format_lines({"steady_state": st}))


@pytest.mark.parametrize("run_id", ["full", "steps_only"])
def test_times_outside_a_given_span_are_left_out_not_clamped(runs, run_id):
    """Windowing [20, 60] s of a 100 s run counts the tokens in it (both ends included) and
    none of those before or after it, which an edge window would take if times were clamped."""
    con, built = runs
    times = built[run_id][0]
    t_first = con.execute("select t_first from run_summary where run_id = ?", [run_id]).fetchall()[0][0]
    r = steady._query(con, run_id, t_first + 20.0, t_first + 60.0)
    inside = ((times >= t_first + 20.0) & (times <= t_first + 60.0)).sum()
    assert 0 < inside < len(times)
    assert r["tokens"] == pytest.approx(inside, rel=1e-12)
    assert r["windows"] * r["window_s"] == pytest.approx(40.0)


@pytest.mark.parametrize("variant", ["requests_only", "steps_only", "few"])
@pytest.mark.long
def test_the_section_does_not_depend_on_the_order_of_the_records(tmp_path, variant):
    """The same records in another order give the same bits: every sum of the noise (squared
    tokens too) is exact. A float sum of squares gave 1.4126016992744872 in file order and
    ...885 shuffled (the case below, found by the canonical property test)."""
    if variant == "few":
        recs = [{"kind": "run", "run_id": "o", "clock": "monotonic"}]
        recs += [{"kind": "iteration", "iter": 0, "t_start": 0.0, "t_end": 0.0, "decode_tokens": 0}]
        recs += [
            {"kind": "request", "req_id": i, "t_arrival": a, "t_first_token": f, "t_finish": e, "output_tokens": n}
            for i, (a, f, e, n) in enumerate(
                [
                    (0.0, 0.0, 524.3677090535473, 20),
                    (0.0, 0.0, 554.8075220566359, 18),
                    (97.5, 151.74195386282548, 694.1633831601978, 16),
                ]
            )
        ]
    else:
        kw = dict(steps=False) if variant == "requests_only" else dict(requests=False)
        recs, *_ = build(ramp_hold_drain, "o", **kw)
    sections = []
    for name, order in (("a", recs), ("b", recs[:1] + recs[1:][::-1])):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in order))
        con = store.connect(":memory:")
        ingest.ingest_paths(con, [path])
        store.build_derived(con)
        sections.append(json.dumps(steady.section(con, "o"), sort_keys=True))
        con.close()
    assert sections[0] == sections[1]


def test_a_one_request_run_is_too_short_to_tell(runs):
    st = section(runs, "one")
    assert not st["reached"] and st["reason"].startswith("too short to tell")
    assert st["peak_output_tokens_per_s"] is None and st["peak_window_s"] is None


Q30 = "llmservingsim/bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507/vllm/requests.jsonl"


def test_real_vllm_run_finds_the_plateau_an_engineer_picks(tmp_path, realdata):
    """A real vLLM bench run (300 requests, 64 s): the rate ramps 345 -> 5,395 tokens/s over
    seven 3.2 s windows, holds ~5,060-5,400 over windows 7-12 (22.4..41.6 s), then drains."""
    con = store.connect(tmp_path / "q.duckdb")
    try:
        ingest.ingest_paths(con, [realdata / Q30], run_id="q30")
        store.build_derived(con)
        st = steady.section(con, "q30")["steady_state"]
    finally:
        con.close()
    assert st["reached"], st["reason"]
    a, b = st["steady_window_s"]
    assert 19 <= a <= 23 and 41 <= b <= 45
    assert 5000 <= st["steady_output_tokens_per_s"] <= 5400


def _batch_se(rates: np.ndarray) -> tuple[float, float]:
    """Batch-means SE of the mean of ``rates`` with the AR(1) inflation, and the lag-1 autocorrelation."""
    d = rates - rates.mean()
    rho = float((d[1:] * d[:-1]).sum() / (d * d).sum())
    r = max(rho, 0.0)
    return float(np.sqrt((d * d).sum() / (len(d) - 1) / len(d) * (1 + r) / (1 - r))), rho


@pytest.mark.parametrize("run_id", ["full", "steps_only"])
def test_uncertainty_is_batch_means_over_the_steady_windows(runs, run_id):
    """The steady rates' SE, lag-1 autocorrelation and edge allowance, recounted with numpy from
    the built token times (and finish times) on the section's windows."""
    con, built = runs
    times, _, finish = built[run_id]
    st = section(runs, run_id)
    u = st["uncertainty"]
    w, (a, b) = st["window_s"], st["steady_window_s"]
    t0 = con.execute("select t_first from run_summary where run_id = ?", [run_id]).fetchall()[0][0]
    k0, k1 = round((a - t0) / w), round((b - t0) / w) - 1
    edges = t0 + w * np.arange(st["windows"] + 1)
    tok = np.histogram(times, edges)[0].astype(float)
    rates = tok[k0 : k1 + 1] / w
    assert u["windows"] == k1 - k0 + 1 >= 10
    se, rho = _batch_se(rates)
    assert rates.mean() == pytest.approx(st["steady_output_tokens_per_s"], rel=1e-12)
    assert u["output_tokens_per_s_se"] == pytest.approx(se, rel=1e-9)
    assert u["lag1_autocorrelation"] == pytest.approx(rho, rel=1e-9)

    def moved(counts: np.ndarray) -> float:
        v, m = counts[k0 : k1 + 1].sum() / (len(rates) * w), len(rates)
        left = [
            abs(counts[k0 : k1 + 1].sum() + s * counts[k] - v * (m + s) * w) / ((m + s) * w)
            for k, s in ((k0 - 1, 1), (k0, -1))
            if k >= 0
        ]
        right = [
            abs(counts[k0 : k1 + 1].sum() + s * counts[k] - v * (m + s) * w) / ((m + s) * w)
            for k, s in ((k1 + 1, 1), (k1, -1))
            if k < len(counts)
        ]
        return max(left) + max(right)

    assert u["output_tokens_per_s_edge"] == pytest.approx(moved(tok), rel=1e-9)
    if run_id == "steps_only":
        assert u["requests_per_s_se"] is None and u["requests_per_s_edge"] is None
    else:
        fin = np.histogram(finish, edges)[0].astype(float)
        assert u["requests_per_s_se"] == pytest.approx(_batch_se(fin[k0 : k1 + 1] / w)[0], rel=1e-9)
        assert u["requests_per_s_edge"] == pytest.approx(moved(fin), rel=1e-9)
    assert u["no_interval"] is None


def test_a_steady_window_of_few_windows_has_no_interval(runs):
    """The 30 s hold of ``short_hold`` is 8 windows of 5 s, under ``min_interval_windows``: no
    SE, the section says why, and the edge allowance is still there."""
    st = section(runs, "short_hold")
    u = st["uncertainty"]
    assert st["reached"] and u["windows"] == 8 < steady.STEADY.min_interval_windows
    assert u["output_tokens_per_s_se"] is None and u["requests_per_s_se"] is None
    assert u["output_tokens_per_s_edge"] > 0
    assert u["no_interval"] == "the steady window has 8 windows, fewer than 10"


def test_text_and_report_show_the_steady_interval(runs, summaries):
    """The 95% half-width shown is t(0.975, m - 1) * SE + edge, recomputed from the section."""
    from scipy.stats import t as student_t

    from pipeline.report.render import _stats_table

    st = summaries["full"]["steady_state"]
    u = st["uncertainty"]
    half = student_t.ppf(0.975, u["windows"] - 1) * u["output_tokens_per_s_se"] + u["output_tokens_per_s_edge"]
    line = next(x for x in format_summary(summaries["full"]).splitlines() if "95% interval" in x)
    assert f"±{half:.1f} output tokens/s" in line and f"over {u['windows']} windows" in line
    v = st["steady_output_tokens_per_s"]
    assert f"{v - half:.1f} .. {v + half:.1f} (±{half:.1f})" in _stats_table(summaries["full"])
    short = section(runs, "short_hold")
    assert "  no interval: the steady window has 8 windows, fewer than 10" in steady.format_lines(
        {"steady_state": short}
    )


def _steps_only_twin(tmp_path, workload=None, spec=None, seed: int = 1) -> tuple[dict, dict]:
    """The steady-state sections of a simulated run read from its requests and from its steps alone."""
    from pipeline.sim import run_simulation

    full = tmp_path / "full.jsonl"
    run_simulation(full, truth=False, run_id="full", seed=seed, workload=workload, **({"spec": spec} if spec else {}))
    lines = [x for x in full.read_text().splitlines() if '"request"' not in x]
    steps = tmp_path / "steps.jsonl"
    steps.write_text("\n".join(x.replace('"run_id":"full"', '"run_id":"steps"') for x in lines) + "\n")
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [full, steps])
    store.build_derived(con)
    try:
        return tuple(steady.section(con, r)["steady_state"] for r in ("full", "steps"))
    finally:
        con.close()


def test_a_load_swinging_every_few_windows_is_not_steady_from_its_steps_either(tmp_path):
    """The steps' scatter of window rates also holds a load's swings: taken whole into the band
    (±103%), a load swinging between 0.2 and 1 of its peak five times in 200 s was steady from its
    server log, and not from its requests."""
    from pipeline.sim import WorkloadSpec, build_workload

    rng = np.random.default_rng(3)
    t, ts = 0.0, []
    while t < 200.0:
        t += rng.exponential(1 / (12.0 * (0.6 + 0.4 * np.sin(2 * np.pi * t / 40.0))))
        ts.append(t)
    w = build_workload(WorkloadSpec(requests=len(ts), rate_rps=5), 1)
    by_requests, by_steps = _steps_only_twin(
        tmp_path, workload=type(w)(np.array(ts), w.prompt_tokens, w.output_tokens, w.req_id)
    )
    assert not by_requests["reached"] and not by_steps["reached"], by_steps
    assert by_steps["band"] == pytest.approx(2 * steady.STEADY.max_scatter)


def test_a_poisson_load_from_its_steps_alone_reaches_the_steady_state_its_requests_do(tmp_path):
    """A server log has steps only. Counting steps as independent units put a Poisson load's
    window noise at 0.045 (its requests say 0.22), its band at the 20% floor while its windows
    scatter by about 20%: no steady state, for any run loaded from a server log alone. The band
    now takes the windows' own scatter too."""
    from pipeline.sim import WorkloadSpec

    by_requests, by_steps = _steps_only_twin(tmp_path, spec=WorkloadSpec(requests=600, rate_rps=8.0))
    assert by_steps["source"] == "iterations" and by_requests["source"] != "iterations"
    assert by_steps["counting_noise"] < 0.1 < by_requests["counting_noise"]  # steps look quieter than they are
    assert by_requests["reached"] and by_steps["reached"], by_steps["reason"]
    assert by_steps["band"] > 0.21  # above the 20% floor: the windows scatter more than steps count
    rate = by_steps["steady_output_tokens_per_s"] / by_requests["steady_output_tokens_per_s"]
    assert abs(rate - 1) < 0.05
