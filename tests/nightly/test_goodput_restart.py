"""Goodput series restart when the SLO file's [goodput] limits change: a new definition of a good
request is no change of the system, so it neither raises a change point nor fails the night."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import numpy as np
import polars as pl
import pytest

from pipeline.nightly import analysis, job
from pipeline.nightly.changepoint import Settings
from pipeline.nightly.history import Night

from .conftest import cli, simulate_night

LOOSE = "[slo]\nttft_ms.p99 = 60000\n[goodput]\nttft_ms = 60000\ntpot_ms = 1000\nmin_attainment = 0.1\n"
# a TPOT limit near the simulated nights' median TPOT (about 9 ms): half the requests are good
TIGHT = "[slo]\nttft_ms.p99 = 60000\n[goodput]\nttft_ms = 60000\ntpot_ms = 9\nmin_attainment = 0.1\n"
# 8 nights, a step after 4 of them: the default detector (0.002) needs about 12 nights to confirm
# anything, this one confirms that step on night 8 (p = 0.02): the test stays small and fast
DETECTOR = Settings(significance=0.05, min_size=3, permutations=999)


def _nights(n: int, limits: dict[int, str]) -> list[Night]:
    """Nights recorded with the SLO file ``limits[i]`` (none where missing)."""
    return [
        Night(
            i + 1,
            f"n{i:02d}",
            f"2026-11-{i + 1:02d}",
            options={"slo": {"path": "slo.toml", "sha256": "", "text": limits[i]}} if i in limits else {},
        )
        for i in range(n)
    ]


def test_goodput_restarts_follow_the_limits_not_the_minima_or_missing_files():
    other_minimum = LOOSE.replace("min_attainment = 0.1", "min_attainment = 0.9")
    no_goodput = "[slo]\nttft_ms.p99 = 60000\n"
    limits = {0: LOOSE, 1: other_minimum, 3: no_goodput, 4: LOOSE, 5: TIGHT, 6: TIGHT, 7: LOOSE}
    # night 2: no SLO file; 3: no [goodput]; 1: another minimum, same definition
    assert analysis.goodput_restarts(_nights(8, limits)) == [5, 7]


def test_a_goodput_step_at_a_limit_change_is_no_change_point_but_one_within_is():
    """24 synthetic nights: attainment drops 40% where the limits change (night 8), and again 25%
    at night 16 with the same limits: only the second is a change point."""
    n = 24
    att = 0.9 * np.exp(np.random.default_rng(7).normal(0, 0.02, n))
    att[8:] *= 0.6
    att[16:] *= 0.75
    nights = _nights(n, {i: LOOSE if i < 8 else TIGHT for i in range(n)})
    series = pl.DataFrame(
        [
            {"run_id": nt.run_id, "seq": nt.seq, "night": nt.night, "metric": m, "value": float(v)}
            for nt, a in zip(nights, att)
            for m, v in (("goodput.attainment", a), ("tpot_ms.p50", 10.0 * (1 + 0.01 * (nt.seq % 3))))
        ]
    )
    found = analysis.changes(series, nights, Settings())
    assert [(c.metric, c.index, c.worse) for c in found] == [("goodput.attainment", 16, True)]
    assert found[0].before == pytest.approx(float(np.median(att[8:16])))  # not the other limits' nights
    # one definition throughout: the step at the limit change is found too (the test can see it)
    same = [dataclasses.replace(nt, options=nights[0].options) for nt in nights]
    assert {c.index for c in analysis.changes(series, same, Settings())} == {8, 16}
    # a regression of the earlier limits is not open once the series restarted
    old = dataclasses.replace(found[0], index=4)
    assert analysis.open_regressions([old], series, nights, 0.05) == []
    assert analysis.open_regressions(found, series, nights, 0.05) != []


@pytest.mark.slow  # nights end to end; CI runs it with -m slow (the default run stays near 5 minutes)
def test_new_goodput_limits_restart_the_series_and_do_not_fail_the_night(tmp_path, capsys, monkeypatch):
    """Eight simulated nights, the [goodput] TPOT limit tightened from night 5: attainment falls
    from 1 to about 0.5, which one definition would call a change for the worse (exit 1 on night 8)."""
    real_run = job.run
    monkeypatch.setattr(job, "run", lambda opts: real_run(dataclasses.replace(opts, detector=DETECTOR)))
    hist = tmp_path / "hist"
    loose, tight = tmp_path / "loose.toml", tmp_path / "tight.toml"
    loose.write_text(LOOSE)
    tight.write_text(TIGHT)
    for i in range(1, 9):
        night = simulate_night(tmp_path / f"n{i}", seed=100 + i, requests=60)
        slo = loose if i <= 4 else tight
        code, stdout, err = cli(
            capsys, "nightly", str(night), "--history", str(hist), "--slo", str(slo), "--label", f"date=2026-11-0{i}"
        )
        assert code == 0, (i, stdout, err)
        said = [line for line in stdout.splitlines() if "goodput limits changed" in line]
        assert said == (["- goodput limits changed on 2026-11-05: goodput series restart"] if i == 5 else []), stdout
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    att = [
        v
        for (v,) in con.execute(
            "select value from nightly_history where metric = 'goodput.attainment' order by night"
        ).fetchall()
    ]
    con.close()
    assert min(att[:4]) > 0.95 and max(att[4:]) < 0.8, att  # the definition did change the values
    # the JSON of the last night: no goodput change point in the whole history
    code, stdout, err = cli(
        capsys, "nightly", str(tmp_path / "n8"), "--history", str(hist), "--slo", str(tight), "--json"
    )
    out = json.loads(stdout)
    assert code == 0 and out["recorded"] is False, err
    assert not [c for c in out["change_points"] if c["metric"].startswith("goodput.")], out["change_points"]
    assert out["goodput_restart"] is None  # said on night 5 only
