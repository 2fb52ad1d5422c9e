"""Re-runs report a night as it was recorded; a broken night rewrites --junit; the config
label digests configuration only; every label shows on the trend page."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import pytest

from pipeline.nightly.history import Night, labels_of
from pipeline.nightly.trend import nights_table

from .conftest import cli, simulate_night

PASS_SLO = "[slo]\nttft_ms.p99 = 60000\n[goodput]\nttft_ms = 60000\ntpot_ms = 1000\n"
FAIL_SLO = "[slo]\ntpot_ms.p50 = 0.001\n"
HOSTILE = '"><img src=x onerror=alert(1)><!--</script>'


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("rerun-nights")
    return [simulate_night(root / f"n{i}", seed=i) for i in range(1, 3)]


def _digests(folder: Path) -> dict[str, str]:
    """Every file of a night's report folder, by content."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _rows(hist: Path) -> list[tuple]:
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    try:
        return con.execute(
            "select run_id, night::varchar, labels, slo_verdict from nightly_runs order by seq"
        ).fetchall()
    finally:
        con.close()


def test_rerun_with_other_options_reports_the_recorded_night(nights, tmp_path, capsys, monkeypatch):
    # the pages' "generated" minute is pinned: a re-run a minute later rewrites the same bytes
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    hist = tmp_path / "hist"
    good, tight = tmp_path / "slo.toml", tmp_path / "tight.toml"
    good.write_text(PASS_SLO)
    tight.write_text(FAIL_SLO)
    base = ["nightly", "--history", str(hist)]
    code, _, _ = cli(
        capsys, *base, str(nights[0]), "--slo", str(good), "--label", "date=2026-01-01", "--label", "team=a"
    )
    assert code == 0
    night_dir = hist / "reports" / "2026-01-01"
    before, rows = _digests(night_dir), _rows(hist)
    assert json.loads((night_dir / "summary.json").read_text())["slo"]["verdict"] == "pass"

    # other SLO file (violated), other date and labels, other --min-change: reported as recorded
    junit = tmp_path / "ci.xml"
    code, stdout, err = cli(
        capsys,
        *base,
        str(nights[0]),
        "--slo",
        str(tight),
        "--label",
        "date=2026-01-18",
        "--label",
        "team=b",
        "--min-change",
        "0.2",
        "--junit",
        str(junit),
        "--json",
    )
    res = json.loads(stdout)
    assert code == 0 and res["exit_code"] == 0 and not res["recorded"]
    assert res["run_id"] == "2026-01-01" and res["labels"]["date"] == "2026-01-01" and res["labels"]["team"] == "a"
    assert res["slo"] == {"verdict": "pass", "passed": True, "failed": []}
    assert "recorded before" in err and "options of this run are ignored" in err
    for bit in ("--slo", "date=2026-01-18 (recorded: date=2026-01-01)", "team=b", "--min-change 0.2"):
        assert bit in err
    assert len(res["ignored_options"]) == 4
    assert _digests(night_dir) == before and _rows(hist) == rows
    assert int(ET.parse(junit).getroot().get("failures")) == 0

    # no --slo: still audited with the recorded SLO file; the report keeps its SLO section
    code, stdout, err = cli(capsys, *base, str(nights[0]))
    assert code == 0 and "SLO: PASS" in stdout and "no --slo" in err
    assert _digests(night_dir) == before and _rows(hist) == rows

    # a night recorded as failing its SLOs stays failing (exit 1) when re-run with a passing SLO file
    code, _, _ = cli(capsys, *base, str(nights[1]), "--slo", str(tight), "--label", "date=2026-01-02")
    assert code == 1
    failing = _digests(hist / "reports" / "2026-01-02")
    code, stdout, err = cli(capsys, *base, str(nights[1]), "--slo", str(good), "--json")
    assert code == 1 and json.loads(stdout)["slo"]["verdict"] == "fail" and "Error: night 2026-01-02: SLO fail" in err
    assert _digests(hist / "reports" / "2026-01-02") == failing

    # the same options again: no warning
    code, _, err = cli(capsys, *base, str(nights[0]), "--slo", str(good), "--label", "team=a")
    assert code == 0 and "Warning" not in err and "recorded before" in err

    # a night of an older history (its options were not kept): an SLO file that contradicts the
    # recorded verdict is refused (exit 2), nothing is rewritten
    con = duckdb.connect(str(hist / "history.duckdb"))
    con.execute("update nightly_runs set options = null")
    con.close()
    rows = _rows(hist)
    code, _, err = cli(capsys, *base, str(nights[0]), "--slo", str(tight))
    assert code == 2 and "does not hold the SLO file" in err
    assert _digests(night_dir) == before and _rows(hist) == rows
    code, _, _ = cli(capsys, *base, str(nights[0]), "--slo", str(good))
    assert code == 0 and _digests(night_dir) == before


@pytest.mark.parametrize(
    ("option", "why"),
    [
        (["--baseline", "2025-12-31"], "--baseline '2025-12-31' is not a night of the history"),
        (["--slo", "{tmp}/moved.toml"], "SLO file {tmp}/moved.toml does not exist"),
        (["--label", "date="], "--label date='': expected an ISO date"),
        (["--label", "date=2026-02-30"], "--label date='2026-02-30': day is out of range"),
        (["--run-id", " "], "--run-id ' ': empty"),
        (["--format", "no-such-format"], "unknown format 'no-such-format'"),
    ],
)
def test_a_rerun_refuses_a_bad_option_as_a_new_night_does(nights, tmp_path, capsys, option, why):
    """A re-run reports the night with its recorded options, but a bad option of this run is an
    error all the same (exit 2, --junit rewritten with it), as on a new night: the same command
    line must not pass or fail by whether its files were recorded before."""
    hist, junit = tmp_path / "hist", tmp_path / "ci.xml"
    slo = tmp_path / "slo.toml"
    slo.write_text(PASS_SLO)
    base = ["nightly", str(nights[0]), "--history", str(hist), "--junit", str(junit)]
    code, _, err = cli(capsys, *base, "--slo", str(slo), "--label", "date=2026-01-01")
    assert code == 0, err
    rows, report = _rows(hist), _digests(hist / "reports" / "2026-01-01")
    option = [o.replace("{tmp}", str(tmp_path)) for o in option]
    why = why.replace("{tmp}", str(tmp_path))
    # a new night (other files) and the re-run (the recorded night's files): the same error
    for night in (nights[1], nights[0]):
        code, stdout, err = cli(capsys, *base[:1], str(night), *base[2:], *option)
        assert code == 2 and stdout == "" and err.startswith(f"Error: {why}"), err
        assert (
            next(ET.parse(junit).getroot().iter("error")).get("message")
            == f"tracelat nightly failed: {err[7:].strip()}"
        )
        assert _rows(hist) == rows and _digests(hist / "reports" / "2026-01-01") == report


@pytest.mark.long
def test_broken_night_rewrites_the_junit_file(nights, tmp_path, capsys):
    hist, junit = tmp_path / "hist", tmp_path / "ci.xml"
    code, _, _ = cli(capsys, "nightly", str(nights[0]), "--history", str(hist), "--junit", str(junit))
    assert code == 0 and int(ET.parse(junit).getroot().get("errors")) == 0
    bad = tmp_path / 'bad <&"> night.jsonl'
    bad.write_text("this is not a trace\n" * 5)
    code, _, err = cli(capsys, "nightly", str(bad), "--history", str(hist), "--junit", str(junit))
    assert code == 2
    root = ET.parse(junit).getroot()  # valid XML, whatever the message holds
    assert root.get("errors") == "1" and root.get("failures") == "0"
    (error,) = root.iter("error")
    assert error.get("message") and error.get("message") == error.text
    assert error.get("message").removeprefix("tracelat nightly failed: ") in err
    # a bad --label too (a usage error of this command)
    junit.unlink()
    code, _, _ = cli(
        capsys, "nightly", str(nights[1]), "--history", str(hist), "--label", "nokey", "--junit", str(junit)
    )
    assert code == 2 and "KEY=VALUE" in next(ET.parse(junit).getroot().iter("error")).get("message")
    # a value click refuses before the command runs (both spellings of --junit)
    for junit_args in (["--junit", str(junit)], [f"--junit={junit}"]):
        junit.write_text("<testsuite errors='0' failures='0'/>")  # an older night's good result
        code, _, err = cli(capsys, "nightly", str(nights[1]), "--history", str(hist), "--min-change", "-1", *junit_args)
        message = next(ET.parse(junit).getroot().iter("error")).get("message")
        assert code == 2 and "--min-change" in message and "-1" in message and "--min-change" in err


@pytest.mark.long
def test_config_label_digests_configuration_only(nights, tmp_path):
    from pipeline import store
    from pipeline.ingest import ingest_paths
    from pipeline.summary import summary

    def run_of(folder: Path) -> dict:
        con = store.connect(tmp_path / f"{folder.name}.duckdb")
        ingest_paths(con, [folder], run_id="bench")
        store.build_derived(con)
        run = summary(con, "bench")["run"]
        con.close()
        return run

    a, b = run_of(nights[0]), run_of(nights[1])
    assert a["meta"]["workload"] != b["meta"]["workload"]  # measured: duration, token means
    assert labels_of({"run": a}, "2026-01-01", {})["config"] == labels_of({"run": b}, "2026-01-02", {})["config"]
    from pipeline.nightly.history import config_digest

    other = simulate_night(tmp_path / "slow", seed=1, a_ms_per_ctx=0.0004)  # another (simulated) engine
    assert config_digest(run_of(other)) != config_digest(a)
    meta = {"max_num_seqs": 256, "reported": {"mean_ttft_ms": 10.0}, "perf_counter_origin_s": 5.0}
    run = {"engine": "vllm", "model": "m", "gpu": "h100", "dtype": "bfloat16", "meta": meta}
    same = {**run, "meta": {**meta, "reported": {"mean_ttft_ms": 12.0}, "perf_counter_origin_s": 9.0}}
    assert config_digest(run) == config_digest(same)
    for key, value in (("max_num_seqs", 128), ("max_num_batched_tokens", 8192), ("kv_block_size", 32)):
        assert config_digest({**run, "meta": {**meta, key: value}}) != config_digest(run)
    assert config_digest({**run, "dtype": "float16"}) != config_digest(run)
    assert config_digest({"meta": {"source_format": "x"}}) is None


def test_trend_table_shows_every_label_escaped(tmp_path):
    nights = [
        Night(1, "n1", "2026-01-01", labels={"date": "2026-01-01", "team": "infra", HOSTILE: HOSTILE, "commit": "c1"}),
        Night(2, "n2", "2026-01-02", labels={"date": "2026-01-02", "vllm": "0.32.1"}),
    ]
    html = nights_table(tmp_path, nights)
    assert "team = infra" in html and "vllm = 0.32.1" in html and "c1" in html
    assert HOSTILE not in html and "<img" not in html and "<!--" not in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
