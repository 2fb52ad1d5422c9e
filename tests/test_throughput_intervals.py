"""Throughput intervals against re-runs of one known load (pipeline/compare.py, pipeline/steady.py).

Poisson arrivals at a known rate with output lengths uniform on 1..39 (mean 20 exactly), so
the load's true output rate is ``rate * 20`` tokens/s; tokens stream 50 ms apart, so a request
spans a window or two and neighbouring windows share requests. Each request run also gets a
steps-only twin: 20 ms engine steps carrying the tokens that came out in them. Re-runs of one
load must not be flagged by `tracelat compare` (at 99%, at most one of 12 pairs), a load half as
big again must be, and the steady rate's 95% interval must cover the true rate about 95% of the
time with a standard error the size of the runs' real scatter.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import t as student_t

from pipeline import ingest, steady, store
from pipeline.compare import compare
from pipeline.errors import InputError

RATE, N_REQ, MEAN_OUT, GAP_S, STEP_S = 10.0, 600, 20, 0.05, 0.02
SAME, LIFTED = 24, 6  # runs of the load, runs of 1.5 times it


def _run(run_id: str, rate: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Request records and the steps-only twin's records of one run."""
    rng = np.random.default_rng(seed)
    arrival = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, N_REQ - 1))])
    out = rng.integers(1, 2 * MEAN_OUT, N_REQ)
    reqs: list[dict] = [{"kind": "run", "run_id": run_id, "engine": "hand"}]
    times = []
    for j, (a, m) in enumerate(zip(arrival, out)):
        tt = a + 0.05 + GAP_S * np.arange(m)
        times.append(tt)
        reqs.append(
            {
                "kind": "request",
                "req_id": f"r{j}",
                "t_arrival": float(a),
                "t_first_token": float(tt[0]),
                "t_finish": float(tt[-1]),
                "prompt_tokens": 16,
                "output_tokens": int(m),
                "token_times": tt.tolist(),
            }
        )
    ends = np.arange(1, int(np.ceil(np.concatenate(times).max() / STEP_S)) + 2) * STEP_S
    per_step = np.histogram(np.concatenate(times), np.concatenate([[0.0], ends]))[0]
    steps: list[dict] = [{"kind": "run", "run_id": f"{run_id}-steps", "engine": "hand"}]
    steps += [
        {"kind": "iteration", "iter": i, "t_start": float(e - STEP_S), "t_end": float(e), "decode_tokens": int(d)}
        for i, (e, d) in enumerate(zip(ends, per_step))
    ]
    return reqs, steps


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    path = tmp_path_factory.mktemp("intervals") / "runs.jsonl"
    with path.open("w") as f:
        for i in range(SAME + LIFTED):
            reqs, steps = _run(f"run{i}", RATE if i < SAME else 1.5 * RATE, 100 + i)
            f.writelines(json.dumps(r) + "\n" for r in reqs)
            if i < SAME:
                f.writelines(json.dumps(r) + "\n" for r in steps)
    c = store.connect(path.with_suffix(".duckdb"))
    ingest.ingest_paths(c, [path])
    store.build_derived(c)
    yield c
    c.close()


@pytest.mark.long
def test_the_steady_interval_covers_the_true_rate(con):
    """95% intervals (t on the windows, plus the edge allowance) cover ``rate * 20`` in at least 21
    of 24 runs, and the SE is the runs' real scatter (within a factor 1.6 either way)."""
    truth = RATE * MEAN_OUT
    covered, se, err = 0, [], []
    for i in range(SAME):
        st = steady.section(con, f"run{i}")["steady_state"]
        assert st["reached"], st["reason"]
        u = st["uncertainty"]
        v = st["steady_output_tokens_per_s"]
        half = student_t.ppf(0.975, u["windows"] - 1) * u["output_tokens_per_s_se"] + u["output_tokens_per_s_edge"]
        covered += abs(v - truth) <= half
        se.append(u["output_tokens_per_s_se"])
        err.append(v - truth)
    assert covered >= 21, covered
    assert 1 / 1.6 < np.mean(se) / np.std(err, ddof=1) < 1.6, (np.mean(se), np.std(err, ddof=1))


def _verdicts(con, pairs) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for b, c in pairs:
        comp = compare(con, b, con, c, resamples=200)
        for d in comp.deltas:
            if d.metric == "throughput":
                out.setdefault(d.stat, []).append(d.verdict)
    return out


@pytest.mark.slow  # many simulated re-runs; CI runs it with -m slow (the default run stays near 5 minutes)
def test_re_runs_of_one_load_are_not_flagged(con):
    """Whole-run and steady rates of re-runs, from requests and from steps: at most one flag in
    12 pairs at 99% (an SE that leaves out how the count of requests varies flags several)."""
    for suffix, stats in (("", 4), ("-steps", 2)):
        got = _verdicts(con, [(f"run{i}{suffix}", f"run{i + 1}{suffix}") for i in range(0, SAME, 2)])
        assert len(got) == stats, got.keys()
        for stat, verdicts in got.items():
            # a steps-only twin sees no requests, so its counting noise (9%) is under the windows'
            # real scatter (26%) and a few twins are judged bursty: no steady state to compare
            least = 6 if suffix and stat.startswith("steady") else 10
            assert len(verdicts) >= least and sum(v in ("regression", "improvement") for v in verdicts) <= 1, (
                stat,
                verdicts,
            )


@pytest.mark.long
def test_a_load_half_as_big_again_is_an_improvement(con):
    got = _verdicts(con, [(f"run{i}", f"run{SAME + i}") for i in range(LIFTED)])
    for stat in ("output_tokens_per_s", "requests_per_s", "steady_output_tokens_per_s"):
        assert got[stat] == ["improvement"] * LIFTED, (stat, got[stat])


def test_the_steady_delta_is_the_two_sections_combined(con):
    """The CI of a steady-rate delta: t (99%, on the fewer windows) times the SEs in quadrature,
    plus both runs' edge allowances, around candidate - baseline; the skipped reason of a stat
    the runs lack names which run lacks it."""
    a, b = (steady.section(con, r)["steady_state"] for r in ("run0", "run1"))
    comp = compare(con, "run0", con, "run1", resamples=200)
    for name in ("output_tokens_per_s", "requests_per_s"):
        ua, ub = a["uncertainty"], b["uncertainty"]
        q = student_t.ppf(0.995, min(ua["windows"], ub["windows"]) - 1)
        half = q * np.hypot(ua[f"{name}_se"], ub[f"{name}_se"]) + ua[f"{name}_edge"] + ub[f"{name}_edge"]
        d = next(d for d in comp.deltas if d.stat == f"steady_{name}")
        assert d.delta == pytest.approx(b[f"steady_{name}"] - a[f"steady_{name}"], rel=1e-12)
        assert (d.ci_low, d.ci_high) == pytest.approx((d.delta - half, d.delta + half), rel=1e-12)
    with pytest.raises(InputError, match="share no statistic") as e:  # the run and its steps-only twin
        compare(con, "run0", con, "run0-steps", resamples=200)
    assert "steady_output_tokens_per_s: counted from requests in the baseline and from steps in the candidate" in str(
        e.value
    )
    assert "steady_requests_per_s: candidate: no ok requests" in str(e.value)
