"""Goodput observed vs replayed in a validation replay (`replay RUN --slo FILE`, `report --calibrate --slo`):
both sides by the one implementation (pipeline.slo.goodput), checked here against numpy on the
recorded run and on the ingested replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import store
from pipeline.cli import run_captured
from pipeline.metrics import run_info


def _good(rows: list[tuple], ttft_lim: float, tpot_lim: float) -> np.ndarray:
    """Per request: ok, TTFT within its limit, TPOT within its limit (a one-token output has none and passes)."""
    return np.array(
        [
            s == "ok"
            and t is not None
            and t <= ttft_lim
            and ((p is not None and p <= tpot_lim) or (p is None and n <= 1))
            for s, t, p, n in rows
        ]
    )


@pytest.mark.long
def test_goodput_observed_and_replayed_match_numpy(steady_db, tmp_path):
    con = store.connect(steady_db, read_only=True)
    ttft_lim, tpot_lim = con.execute(
        "select median(ttft_ms), quantile_cont(tpot_ms, 0.9) from request_latency "
        "where run_id = 'steady' and status = 'ok'"
    ).fetchone()
    con.close()
    slo = tmp_path / "slo.toml"
    slo.write_text(f"[goodput]\nttft_ms = {ttft_lim}\ntpot_ms = {tpot_lim}\n")
    code, text = run_captured(
        "replay",
        "steady",
        "--db",
        steady_db,
        "--json",
        "--seeds",
        "1",
        "--seed",
        "3",
        "--slo",
        slo,
        "--out",
        tmp_path / "r.jsonl",
        "--ingest",
    )
    assert code == 0, text
    doc = json.loads(text)
    gp = {r["stat"]: r for r in doc["calibration_report"]["goodput"]}
    con = store.connect(steady_db, read_only=True)
    q = (
        "select status, ttft_ms, tpot_ms, output_tokens from request_latency where run_id = ? and req_id in "
        "(select req_id from request_latency where run_id = 'steady' and status = 'ok')"
    )
    obs = con.execute(q, ["steady"]).fetchall()
    rep = con.execute(q, [doc["replay_run_ids"][0]]).fetchall()
    duration_s = run_info(con, "steady")["duration_s"]
    con.close()
    want_obs, want_rep = _good(obs, ttft_lim, tpot_lim).mean(), _good(rep, ttft_lim, tpot_lim).mean()
    assert 0.2 < want_obs < 0.8  # the limits make the check meaningful
    assert abs(gp["attainment"]["observed"] - want_obs) < 1e-12
    assert abs(gp["attainment"]["replay"] - want_rep) < 1e-12
    assert gp["attainment"]["rel_error"] == (want_rep - want_obs) / want_obs
    # the rates: good requests (and their output tokens) over the run's duration
    good = _good(obs, ttft_lim, tpot_lim)
    assert np.isclose(gp["request_goodput_rps"]["observed"], good.sum() / duration_s, rtol=1e-12)
    tokens = np.array([n for *_, n in obs], dtype=float)
    assert np.isclose(gp["token_goodput_tps"]["observed"], tokens[good].sum() / duration_s, rtol=1e-12)
    text_out = run_captured("replay", "steady", "--db", steady_db, "--seeds", "1", "--slo", slo)[1]
    assert "goodput (SLO file, requests recorded ok): attainment" in text_out


def test_slo_without_goodput_section_is_a_usage_error(steady_db, tmp_path):
    slo = tmp_path / "slo.toml"
    slo.write_text("[slo]\nttft_ms.p99 = 100\n")
    code, text = run_captured("replay", "steady", "--db", steady_db, "--seeds", "1", "--slo", slo)
    assert code == 2 and "[goodput]" in text


def test_slo_limits_a_single_replay_leaves_out_are_named(steady_db, tmp_path):
    """A single replay judges [goodput] only; the file's [slo] limits and [fluidity] were dropped without a word."""
    slo = tmp_path / "slo.toml"
    slo.write_text(
        "[goodput]\nttft_ms = 500\n\n[slo]\nttft_ms.p99 = 100\ntpot_ms.p90 = 50\n\n[fluidity]\nttft_deadline_ms = 2000\ntbt_deadline_ms = 100\nmin_index_p01 = 0.9\n"
    )
    code, text = run_captured("replay", "steady", "--db", steady_db, "--seeds", "1", "--json", "--slo", slo)
    assert code == 0, text
    notes = json.loads(text)["notes"]
    said = [n for n in notes if n.startswith("--slo: a single replay uses the file's [goodput] only")]
    assert said and "not its 2 [slo] limit(s) and [fluidity]" in said[0]
    slo.write_text("[goodput]\nttft_ms = 500\n")
    code, text = run_captured("replay", "steady", "--db", steady_db, "--seeds", "1", "--json", "--slo", slo)
    assert code == 0 and not any("[goodput] only" in n for n in json.loads(text)["notes"])
