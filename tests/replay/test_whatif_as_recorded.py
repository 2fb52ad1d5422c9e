"""A what-if's change is counted against the replay at the recorded policy, not against the run.

On the vLLM queue recording the replay is far from the run (TTFT p50 -44%: not trusted), so a
token budget of 257 instead of the recorded 256 showed "TTFT p50 -44.5%" as its effect: the
validation's error, printed as a change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..clirun import run_cli

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_queue"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vq") / "vq.duckdb"
    r = run_cli("ingest", FIX / "server_epoch.log", FIX / "requests.jsonl", "--run-id", "vq", "--db", path)
    assert r.returncode == 0, r.stderr
    return path


def _rows(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["metric"], r["stat"]): r for r in doc["rows"]}


@pytest.mark.long
def test_a_change_that_does_nothing_shows_no_change(db):
    args = ("replay", "vq", "--db", db, "--seeds", "2", "--json")
    val = run_cli(*args)
    wif = run_cli(*args, "--max-num-batched-tokens", "257")
    assert val.returncode == 0 and wif.returncode == 0, (val.stderr, wif.stderr)
    v, w = _rows(json.loads(val.stdout)), _rows(json.loads(wif.stdout))
    # the baseline is the validation replay itself (same seeds, same policy)
    for key, row in w.items():
        assert row["as_recorded"] == pytest.approx(v[key]["replay"], rel=1e-12, abs=1e-12), key
    ttft = w[("ttft_ms", "p50")]
    assert ttft["rel_error"] < -0.3  # the model's own error against the run is large...
    assert abs(ttft["rel_change"]) < 0.05  # ...and is not the what-if's effect
    assert ttft["rel_change"] == pytest.approx((ttft["replay"] - ttft["as_recorded"]) / ttft["as_recorded"])
    doc = json.loads(wif.stdout)
    assert (
        doc["as_recorded_verdict"].startswith("trustworthy for what-ifs") and "not: ttft" in doc["as_recorded_verdict"]
    )
    text = run_cli("replay", "vq", "--db", db, "--seeds", "2", "--max-num-batched-tokens", "257").stdout
    assert "observed as recorded    what-if   change" in text
    line = next(x for x in text.splitlines() if x.startswith("ttft_ms p50"))
    assert line.split()[5] == f"{ttft['rel_change'] * 100:+.1f}%", line
    assert "the replay as recorded against the run: trustworthy for what-ifs" in text and "not: ttft" in text


def test_a_validation_replay_has_no_baseline_column(db):
    r = run_cli("replay", "vq", "--db", db, "--seeds", "1", "--json")
    doc = json.loads(r.stdout)
    assert doc["mode"] == "validation" and doc["as_recorded_verdict"] is None
    assert all("as_recorded" not in row for row in doc["rows"])


@pytest.mark.long
def test_a_what_if_runs_when_the_recorded_policy_cannot(tmp_path):
    """A run whose recorded KV capacity holds not its largest request: `replay` says to pass a larger
    --kv-capacity-tokens, and the what-if with one failed (the baseline replay at the recorded
    capacity raised). The what-if runs, its change against the run itself, with a note why."""
    trace = tmp_path / "s.jsonl"
    assert run_cli("simulate", "--requests", "120", "--rate", "2", "--seed", "3", "--out", trace).returncode == 0
    text = trace.read_text()
    cap = json.loads(text.splitlines()[0])["meta"]["kv_capacity_tokens"]
    trace.write_text(text.replace(f'"kv_capacity_tokens":{cap}', '"kv_capacity_tokens":600', 1))
    db = tmp_path / "s.duckdb"
    assert run_cli("ingest", trace, "--db", db).returncode == 0
    r = run_cli("replay", "s", "--db", db, "--seeds", "1")
    assert r.returncode == 2 and "--kv-capacity-tokens" in r.stderr, r.stderr
    r = run_cli("replay", "s", "--db", db, "--seeds", "1", "--kv-capacity-tokens", "1000000", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "what-if" and doc["as_recorded_verdict"] is None
    assert any(
        n.startswith("the change is against the run itself: the recorded policy cannot be replayed")
        for n in doc["notes"]
    )
    assert all("as_recorded" not in row for row in doc["rows"])
