"""A slower GPU from night 9 of 16 (the simulator's per-context-token cost doubled):
``tracelat nightly`` finds the change in TPOT and in the fitted bandwidth at that night,
fails the night it first confirms it, and names the decode baseline as the tail cause."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from .conftest import cli, simulate_night

NIGHTS, CHANGE = 16, 9


@pytest.mark.slow
def test_slower_gpu_shows_in_tpot_and_bandwidth(tmp_path, capsys):
    hist, out = tmp_path / "hist", tmp_path / "out"
    codes, last = [], None
    for i in range(1, NIGHTS + 1):
        a = 0.0002 if i < CHANGE else 0.0004  # half the effective KV bandwidth
        night = simulate_night(tmp_path / f"n{i}", seed=i, a_ms_per_ctx=a, requests=150)
        code, stdout, _ = cli(
            capsys,
            "nightly",
            str(night),
            "--history",
            str(hist),
            "--out",
            str(out),
            "--label",
            f"date=2026-11-{i:02d}",
            "--json",
            "--junit",
            str(tmp_path / f"j{i}.xml"),
        )
        codes.append(code)
        last = json.loads(stdout)
        # the JUnit file fails exactly the statistics whose new change fails the night
        (suite,) = ET.parse(tmp_path / f"j{i}.xml").getroot().findall("testsuite")
        failed = sorted(c.get("name").split(":")[0] for c in suite if c.find("failure") is not None)
        gating = sorted({c["metric"] for c in last["new_change_points"] if c["worse"] and abs(c["rel_change"]) >= 0.05})
        assert failed == gating and (code == 1) == bool(gating)
    assert codes[:CHANGE] == [0] * CHANGE  # nothing to find before enough nights after the change
    assert 1 in codes  # the night the change is confirmed fails
    at = {f"2026-11-{d:02d}" for d in (CHANGE - 1, CHANGE, CHANGE + 1)}
    found = {c["metric"]: c for c in last["change_points"] if c["run_id"] in at}
    bw = found["fit.effective_bandwidth_gbps"]
    assert bw["rel_change"] == pytest.approx(-0.5, abs=0.1) and bw["p_value"] <= 0.002
    tpot = [c for m, c in found.items() if m.startswith("tpot_ms.")]
    assert tpot and all(c["rel_change"] > 0.3 for c in tpot)
    md = (out / last["run_id"] / "nightly.md").read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith("- ") and ("TPOT p" in ln or "effective bandwidth" in ln)]
    assert lines and all("decode baseline share (TPOT tail)" in ln for ln in lines)
