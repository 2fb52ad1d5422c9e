"""compare: the exact bootstrap against brute-force resampling, verdicts, exit codes, the comparison page."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy import stats

from pipeline.blockboot import Blocked, weights
from pipeline.cli import main
from pipeline.compare import blocked_values, compare, delta, mann_whitney, replicates, run_blocks


def _compare(base, cand, stat, confidence, rng, m=100):
    """One statistic of two samples whose values are independent: m blocks by position."""
    vb, vc = (
        Blocked(np.sort(x), (np.arange(len(x)) * m // len(x)).astype(np.int16)[np.argsort(x, kind="stable")], m)
        for x in (base, cand)
    )
    rb, rc = replicates(vb, weights(m, 2000, rng)), replicates(vc, weights(m, 2000, rng))
    return delta("x", stat, vb.xs, vc.xs, rb[stat], rc[stat], 0.05, confidence, m)


@pytest.mark.long
def test_ci_covers_and_verdicts():
    rng = np.random.default_rng(0)
    a = rng.gamma(2, 10, 2000)
    same = _compare(a, a, "p99", 0.95, rng)
    assert same.delta == 0 and same.ci_low < 0 < same.ci_high and same.verdict == "no significant change"
    slow = _compare(a, a * 1.3, "p50", 0.95, rng)
    assert slow.rel == pytest.approx(0.3) and slow.ci_low > 0 and slow.verdict == "regression"
    assert slow.rel_low < 0.3 < slow.rel_high
    fast = _compare(a, a * 0.7, "mean", 0.95, rng)
    assert fast.verdict == "improvement" and fast.rel == pytest.approx(-0.3)
    # a 3% slowdown is real but under a 5% threshold
    small = _compare(a, a * 1.03, "p50", 0.95, rng)
    assert small.ci_low < 0 and small.verdict == "no significant change"
    # on 200k values the same 3% is certain: a real change, under the threshold, said as such
    big = rng.gamma(2, 10, 200_000)
    for factor, side in ((1.03, "ci_low"), (0.97, "ci_high")):
        sure = _compare(big, big * factor, "mean", 0.95, rng)
        assert abs(sure.rel) < 0.05 and sure.verdict == "below threshold"
        assert (getattr(sure, side) > 0) if factor > 1 else (getattr(sure, side) < 0)
        assert not sure.flagged
    # p99.9 of 2000 values has 2 beyond it: reported, without an interval or a verdict
    thin = _compare(a, a * 1.3, "p999", 0.95, rng)
    assert thin.rel == pytest.approx(0.3) and thin.ci_low is None and thin.verdict == "no verdict"


def test_growth_from_a_level_of_zero_is_a_regression_when_its_ci_is_above_zero():
    rng = np.random.default_rng(1)
    none = np.zeros(2000)
    queued = np.where(np.arange(2000) % 2 == 0, 0.0, 4.0)  # every other request now waits 4 ms
    for stat in ("p90", "mean"):
        d = _compare(none, queued, stat, 0.99, rng)
        assert d.rel is None and d.ci_low > 0 and d.verdict == "regression", d
    assert _compare(none, none, "p90", 0.99, rng).verdict == "no significant change"


def test_mann_whitney_is_scipys():
    rng = np.random.default_rng(5)
    b, c = rng.normal(0, 1, 300), rng.normal(0.3, 1, 250)
    got = mann_whitney(b, c, rng)
    want = stats.mannwhitneyu(c, b, alternative="two-sided", method="asymptotic")
    assert got["p_value"] == pytest.approx(want.pvalue) and got["u"] == want.statistic
    assert got["prob_cand_greater"] == pytest.approx(np.mean(c[:, None] > b[None, :]))


@pytest.mark.long
def test_identical_and_noisy_runs_do_not_regress(runs_db):
    con, _ = runs_db
    same = compare(con, "base", con, "base")
    assert same.exit_code == 0 and not same.regressions
    assert all(d.delta == 0 for d in same.deltas)
    assert all(t["p_value"] == pytest.approx(1.0) for t in same.tests.values())
    copy = compare(con, "base", con, "same")  # same data under another run id
    assert [d.delta for d in copy.deltas] == [0] * len(copy.deltas)
    # another draw from the same distributions; their arrivals are the same (every 50 ms), but
    # their latencies do not follow them: resampled independently, as runs of two workloads are
    noisy = compare(con, "base", con, "noise", paired=False)
    assert noisy.exit_code == 0, [d for d in noisy.regressions]


def test_slower_run_is_flagged(runs_db):
    con, _ = runs_db
    res = compare(con, "base", con, "slow")
    assert res.exit_code == 1
    flagged = {(d.metric, d.stat) for d in res.regressions}
    assert {("ttft_ms", "p50"), ("itl_ms", "p50"), ("itl_ms", "mean"), ("iteration_ms", "p50")} <= flagged
    assert res.tests["itl_ms"]["p_value"] < 1e-6 and res.tests["itl_ms"]["prob_cand_greater"] > 0.55
    itl = con.sql("select itl_ms from token_gaps where run_id = 'slow'").fetchnumpy()["itl_ms"]
    row = next(d for d in res.deltas if (d.metric, d.stat) == ("itl_ms", "p99"))
    assert row.cand == pytest.approx(np.percentile(itl, 99))


@pytest.mark.long
def test_cli_exit_codes_and_page(runs_db, tmp_path, capsys):
    _, db = runs_db

    def cli(*args):
        try:
            main(list(args))
            return 0
        except SystemExit as exc:
            return int(exc.code or 0)

    assert cli("compare", "base", "base", "--db", str(db), "--out", str(tmp_path / "same")) == 0
    text = capsys.readouterr().out
    assert "No statistic changed significantly" in text
    # the footer says how many were judged: a statistic without an interval was not checked
    doc = json.loads((tmp_path / "same" / "comparison.json").read_text())
    n = len(doc["deltas"])
    unjudged = sum(d["verdict"] == "no verdict" for d in doc["deltas"])
    assert unjudged and f"{n} statistics compared ({n - unjudged} judged; {unjudged} without a verdict" in text, text
    assert f"{unjudged} of {n} had too few values to judge" in text
    assert cli("compare", "base", "slow", "--db", str(db), "--out", str(tmp_path / "slow"), "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert out["regressed"] and out["exit_code"] == 1
    page = (tmp_path / "slow" / "index.html").read_text()
    specs = json.loads(re.search(r'id="tracelat-specs">(.*?)</script>', page, re.S).group(1))
    assert {"cmp_ttft_ms", "cmp_tpot_ms", "cmp_itl_ms", "cmp_e2e_ms", "deltas"} == set(specs)
    runs = {row["run"] for ds in specs["cmp_itl_ms"]["datasets"].values() for row in ds}
    assert runs == {"baseline", "candidate"}  # overlaid CDFs
    md = (tmp_path / "slow" / "comparison.md").read_text()
    assert "| ttft_ms | p50 |" in md and "regression" in md
    assert cli("compare", "base", "nope", "--db", str(db)) == 2
    assert "run 'nope' is not in the store" in capsys.readouterr().err
    assert cli("compare", "base", "slow", "--db", str(db), "--seed", "-1") == 2  # a usage error, not exit 3
    assert "'--seed': -1 is not in the range x>=0" in capsys.readouterr().err


def test_baseline_from_another_store(runs_db, run_file, tmp_path, capsys):
    from pipeline import ingest, store

    _, db = runs_db
    other = tmp_path / "baseline.duckdb"
    con = store.connect(other)
    ingest.ingest_paths(con, [run_file("nightly", 1.0, 1)])  # the data of run "base", kept elsewhere
    store.build_derived(con)
    con.close()
    try:
        main(
            [
                "compare",
                "nightly",
                "base",
                "--db",
                str(db),
                "--base-db",
                str(other),
                "--out",
                str(tmp_path / "x"),
                "--json",
            ]
        )
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and all(d["delta"] == 0 for d in out["deltas"])


@pytest.mark.slow  # 900 bootstrap comparisons: a minute and more alone; CI runs it with -m slow
def test_ci_coverage_is_near_nominal():
    """Two samples of one distribution: a 90% CI of the difference excludes 0 about 10% of the time."""
    rng = np.random.default_rng(11)
    for stat in ("p50", "p99", "mean"):
        misses = sum(
            not (d.ci_low <= 0 <= d.ci_high)
            for d in (_compare(rng.gamma(4, 2, 1000), rng.gamma(4, 2, 1000), stat, 0.90, rng) for _ in range(300))
        )
        assert 0.04 < misses / 300 < 0.17, (stat, misses)


def test_blocks_of_a_run_follow_its_residence_time(runs_db):
    """The runs' blocks: 4 mean e2e latencies long, clamped to 10..100 blocks, over the span;
    every value sits in the block of its time (a request's arrival, a gap's token)."""
    con, _ = runs_db
    t0, t1, e2e = con.sql(
        "select min(t_arrival), max(greatest(t_finish, t_first_token, t_arrival)), avg(e2e_ms) / 1000 "
        "from request_latency where run_id = 'base' and status = 'ok'"
    ).fetchall()[0]
    rb = run_blocks(con, "base")
    assert rb.blocks == min(100, max(10, int(np.ceil((t1 - t0) / (4 * e2e)))))
    assert rb.t_first == pytest.approx(t0) and rb.width_s == pytest.approx((t1 - t0) / rb.blocks)
    v = blocked_values(con, "base", "ttft_ms", rb)
    lat = con.sql(
        "select ttft_ms, t_arrival from request_latency where run_id = 'base' and status = 'ok' order by ttft_ms"
    ).fetchnumpy()
    assert np.array_equal(v.xs, np.asarray(lat["ttft_ms"], dtype=float))
    want = np.clip(np.floor((lat["t_arrival"] - t0) / rb.width_s), 0, rb.blocks - 1)
    assert np.array_equal(np.sort(v.block), np.sort(want.astype(int)))
    gaps = blocked_values(con, "base", "itl_ms", rb)
    n_gaps = con.sql("select count(*) from token_gaps where run_id = 'base' and itl_ms is not null").fetchall()[0][0]
    assert len(gaps.xs) == n_gaps and gaps.block.max() < rb.blocks


def test_throughput_has_a_ci(runs_db):
    con, _ = runs_db
    res = compare(con, "base", con, "slow")
    tok = next(d for d in res.deltas if (d.metric, d.stat) == ("throughput", "output_tokens_per_s"))
    assert tok.ci_low < tok.delta < tok.ci_high
    same = compare(con, "base", con, "base")
    assert all(d.verdict == "no significant change" for d in same.deltas if d.metric == "throughput")


def test_steps_without_times_are_blocked_by_position(tmp_path):
    """Steps that logged only a duration have no time: they are cut into blocks of equal count
    in step order, while the run's requests keep their time blocks."""
    from pipeline import ingest, store

    lines = [{"kind": "run", "run_id": "d", "engine": "hand"}]
    lines += [{"kind": "iteration", "iter": i, "dur_ms": 5.0 + (i % 7)} for i in range(95)]
    lines += [
        {
            "kind": "request",
            "req_id": f"q{k}",
            "t_arrival": k * 1.0,
            "t_first_token": k + 0.1,
            "t_finish": k + 0.5,
            "output_tokens": 3,
        }
        for k in range(60)
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [path])
    store.build_derived(con)
    rb = run_blocks(con, "d")
    assert rb.width_s is not None and rb.blocks == 30  # 59.5 s / (4 x 0.5 s) = 29.75 -> 30 blocks
    steps = blocked_values(con, "d", "iteration_ms", rb)
    want = sorted(zip([5.0 + (i % 7) for i in range(95)], [i * 30 // 95 for i in range(95)]))
    assert sorted(zip(steps.xs.tolist(), steps.block.tolist())) == want
    ttft = blocked_values(con, "d", "ttft_ms", rb)
    assert sorted(ttft.block.tolist()) == sorted(min(int(k / rb.width_s), 29) for k in range(60))


def test_failed_share_ci_against_newcombes_worked_example():
    """Newcombe (1998), Statistics in Medicine 17:873, Table II example (a): 56/70 vs 48/80,
    difference 0.2 with the hybrid score 95% interval 0.0524 to 0.3339."""
    from pipeline.compare import failed_share_delta

    d = failed_share_delta((48, 80), (56, 70), 0.05, 0.95)
    assert d.delta == pytest.approx(0.2)
    assert d.ci_low == pytest.approx(0.0524, abs=5e-4) and d.ci_high == pytest.approx(0.3339, abs=5e-4)
    assert d.verdict == "regression"


def test_failed_requests_are_compared(runs_db, run_file, tmp_path):
    from pipeline import ingest, store

    lines = [json.loads(x) for x in run_file("base", 1.0, 1).read_text().splitlines()]
    failed = 0
    for i, x in enumerate(lines):
        if x["kind"] == "request" and i % 8 == 0:
            x["status"], failed = "error", failed + 1
    path = tmp_path / "failing.jsonl"
    path.write_text(
        "".join(json.dumps(x | ({"run_id": "failing"} if x["kind"] == "run" else {})) + "\n" for x in lines)
    )
    con = store.connect(tmp_path / "f.duckdb")
    ingest.ingest_paths(con, [path])
    store.build_derived(con)
    base_con, _ = runs_db
    res = compare(base_con, "base", con, "failing")
    row = next(d for d in res.deltas if (d.metric, d.stat) == ("requests", "failed_share"))
    assert row.base == 0 and row.cand == pytest.approx(failed / 300) and row.verdict == "regression"
    # from 0 failures the change has no relative size: the text shows the interval of the difference
    from pipeline.report.compare_page import comparison_markdown

    line = next(x for x in comparison_markdown(res).splitlines() if "failed_share" in x)
    assert f"| {row.ci_low:+,.4g} .. {row.ci_high:+,.4g} (absolute) |" in line and row.ci_low > 0
    assert res.exit_code == 1
    same = next(d for d in compare(base_con, "base", base_con, "noise").deltas if d.stat == "failed_share")
    assert same.delta == 0 and same.verdict == "no significant change"


def test_a_rate_s_relative_interval_stops_at_minus_100_percent():
    """A rate's interval is symmetric around the delta; relative to a small base it went below -100%
    (compare of a 10-request run with itself: output tokens/s within [-115%, +115%])."""
    from pipeline.compare import _rate_delta

    d = _rate_delta("output_tokens_per_s", 50.0, 50.0, 57.6, 0.05)
    assert d.rel_low == -1.0 and d.rel_high == pytest.approx(57.6 / 50.0)
    assert d.ci_low == pytest.approx(-57.6) and d.verdict == "no significant change"
    narrow = _rate_delta("output_tokens_per_s", 50.0, 40.0, 5.0, 0.05)
    assert narrow.rel_low == pytest.approx(-0.3) and narrow.verdict == "regression"


def test_below_threshold_is_said_in_the_text_and_not_for_a_rise_from_zero():
    from pipeline.compare import Comparison, Delta, _rate_delta
    from pipeline.report.compare_page import comparison_markdown

    # from 0 a rate has no relative size: no "below threshold" to give it
    assert _rate_delta("output_tok_s", 0.0, 50.0, 5.0, 0.05).verdict == "no significant change"
    assert _rate_delta("output_tok_s", 100.0, 102.0, 1.0, 0.05).verdict == "below threshold"
    comp = Comparison("a", "b", 0.05, 0.99, 100)
    comp.deltas = [Delta("ttft_ms", "p50", 10.0, 10.2, 0.2, 0.02, 0.1, 0.3, 0.01, 0.03, "below threshold")]
    text = comparison_markdown(comp, only_changes=True)
    assert "No statistic changed beyond the threshold; 1 changed by less" in text
    assert "changed significantly" not in text
