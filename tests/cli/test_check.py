"""tracelat check: the invariant queries pass on good runs and name what breaks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline import store
from pipeline.check import check_files, run_checks
from pipeline.cli import cli
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def _store(tmp_path):
    db = tmp_path / "c.duckdb"
    con = store.connect(db)
    ingest_paths(con, [FIX / "vllm" / "server_epoch.log", FIX / "vllm" / "bench.json"], run_id="cpu")
    store.build_derived(con)
    from pipeline.fit import get_or_fit

    get_or_fit(con, "cpu")
    return db, con


def test_every_check_passes_on_a_real_run(tmp_path):
    _, con = _store(tmp_path)
    res = {r.name: r for r in run_checks(con, "cpu")}
    assert set(res) == {f.name for f in check_files()} and len(res) >= 5
    assert all(r.violations == 0 and r.skipped is None for r in res.values()), res


@pytest.mark.long
def test_a_broken_store_is_named_and_exits_1(tmp_path):
    db, con = _store(tmp_path)
    # a scheduled time after the first token: queueing + prefill no longer a split of TTFT;
    # a token time moved back: out of order
    con.execute(
        "update requests set t_scheduled = t_first_token + 0.5 where req_id = "
        "(select min(req_id) from requests where run_id = 'cpu')"
    )
    # (token times are stored as one list per request; idx 3 is the list's 4th element)
    con.execute(
        "update token_lists set t_s = list_transform(t_s, lambda t, i: if(i = 4, t - 10, t)) "
        "where req_id = (select min(req_id) from token_lists)"
    )
    store.bump_generation(con, ["cpu"])
    store.build_derived(con)
    res = {r.name: r for r in run_checks(con, "cpu")}
    assert res["ttft_is_queue_plus_prefill"].violations == 1
    assert res["token_times_in_order"].violations == 1
    assert "before the previous one" in res["token_times_in_order"].examples[0]["problem"]
    # TTFT still equals queueing + prefill (prefill is -500 ms): the problem says what is wrong
    ex = res["ttft_is_queue_plus_prefill"].examples[0]
    assert abs(ex["ttft_ms"] - (ex["queue_ms"] + ex["prefill_ms"])) < 1e-6 and ex["prefill_ms"] < 0
    assert ex["problem"] == "prefill_ms is negative: t_scheduled is after t_first_token"
    con.close()
    out = CliRunner().invoke(cli, ["check", "cpu", "--db", str(db), "--json"])
    assert out.exit_code == 1
    broken = {r["name"] for r in json.loads(out.output.split("\nError:")[0]) if r["violations"]}
    assert broken == {"ttft_is_queue_plus_prefill", "token_times_in_order"}


def test_attribution_parts_that_do_not_add_up_are_named(tmp_path):
    """attribution_sums: one part of one request moved by 1 ms breaks its TTFT sum (and so its E2E sum)."""
    _, con = _store(tmp_path)
    req, ttft, parts = con.execute(
        "select req_id, ttft_ms, waiting_hol_ms + waiting_capacity_ms + waiting_step_ms + own_prefill_ms "
        "+ unexplained_ttft_ms "
        "+ unattributed_ttft_ms from request_attribution where run_id = 'cpu' order by req_id limit 1"
    ).fetchall()[0]
    assert abs(parts - ttft) <= 1e-6 * max(abs(ttft), 1)  # holds before (independently summed here)
    con.execute(
        "update request_attribution set own_prefill_ms = own_prefill_ms + 1 where run_id = 'cpu' and req_id = ?", [req]
    )
    res = {r.name: r for r in run_checks(con, "cpu")}
    assert res["attribution_sums"].violations == 1
    (ex,) = res["attribution_sums"].examples
    assert ex["req_id"] == req and ex["problem"] == "attribution parts do not add up to ttft_ms"
    assert all(r.violations == 0 for n, r in res.items() if n != "attribution_sums")


def test_check_on_a_fresh_store_checks_the_attribution_too(tmp_path):
    """Right after ingest the attribution check said "skipped (run fit first)", and after a summary
    "ok": check's result depended on the command run before it."""
    from pathlib import Path

    from pipeline.cli import run_captured

    fix = Path(__file__).resolve().parents[2] / "fixtures"
    db = tmp_path / "f.duckdb"
    code, out = run_captured(
        "ingest", fix / "vllm" / "server_epoch.log", fix / "vllm" / "requests.jsonl", "--run-id", "v", "--db", db
    )
    assert code == 0, out
    code, out = run_captured("check", "v", "--db", db)
    assert code == 0 and "skipped" not in out, out
    assert any(line.split() == ["attribution_sums", "ok"] for line in out.splitlines()), out


def test_json_purpose_is_the_whole_sentence(tmp_path):
    """A check's purpose spans several header lines; `check --json` gave only the first, cut
    mid-sentence ("... agrees with its times (1 us), and its")."""
    db, con = _store(tmp_path)
    con.close()
    out = CliRunner().invoke(cli, ["check", "cpu", "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    purpose = {r["name"]: r["purpose"] for r in json.loads(out.output)}
    assert purpose["steps_well_formed"] == (
        "every step ends after it starts, its duration agrees with its times (1 us), and its counts are not negative."
    )
    assert purpose["ingest_lines_add_up"] == (
        "every line of every file was accepted, rejected or skipped: "
        "lines_read = lines_accepted + lines_rejected + lines_skipped."
    )
    assert {f.name: f.inputs for f in check_files()}["token_times_in_order"] == ("tokens", "requests")
