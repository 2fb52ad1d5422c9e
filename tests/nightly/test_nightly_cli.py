"""``tracelat nightly`` end to end on a few small simulated nights: the history, the
JSON, idempotent re-runs, failed nights, SLO gating, escaping on the trend page."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import duckdb
import numpy as np
import pytest

from .conftest import cli, simulate_night, tpot_from_trace

PASS_SLO = "[slo]\nttft_ms.p99 = 60000\n[goodput]\nttft_ms = 60000\ntpot_ms = 1000\n"
FAIL_SLO = "[slo]\ntpot_ms.p50 = 0.001\n"


def _counts(hist: Path) -> tuple[int, int]:
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    try:
        return (
            con.execute("select count(*) from nightly_runs").fetchone()[0],
            con.execute("select count(*) from nightly_history").fetchone()[0],
        )
    finally:
        con.close()


def _history_value(hist: Path, run_id: str, metric: str) -> tuple[float, float, float]:
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    try:
        return con.execute(
            "select value, ci_low, ci_high from nightly_history where run_id = ? and metric = ?", [run_id, metric]
        ).fetchone()
    finally:
        con.close()


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("nights")
    return [simulate_night(root / f"n{i}", seed=i) for i in range(1, 6)]


def test_nights_history_json_rerun_and_failures(nights, tmp_path, capsys):
    hist, out = tmp_path / "hist", tmp_path / "out"
    slo = tmp_path / "slo.toml"
    slo.write_text(PASS_SLO)
    base = ["nightly", "--history", str(hist), "--out", str(out), "--slo", str(slo), "--json"]
    results = []
    for i, night in enumerate(nights[:3], start=1):
        code, stdout, _ = cli(capsys, *base, str(night), "--label", f"date=2026-11-0{i}", "--label", "commit=abc")
        assert code == 0, stdout
        results.append(json.loads(stdout))
    assert [r["run_id"] for r in results] == ["2026-11-01", "2026-11-02", "2026-11-03"]
    assert [r["baseline"] for r in results] == [None, "2026-11-01", "2026-11-02"]
    assert results[2]["slo"] == {"verdict": "pass", "passed": True, "failed": []}
    assert results[2]["labels"]["commit"] == "abc" and results[2]["labels"]["engine"] == "tracelat-sim"
    assert isinstance(results[2]["change_points"], list)
    assert Path(results[2]["files"]["report"]).is_file() and Path(results[2]["files"]["compare"]).is_file()

    # the history holds what the trace says: TPOT p50 recomputed from the file, inside its interval
    tpot = tpot_from_trace(nights[1] / "trace.jsonl")
    value, lo, hi = _history_value(hist, "2026-11-02", "tpot_ms.p50")
    assert value == pytest.approx(np.percentile(tpot, 50), rel=1e-9)
    assert lo < value < hi
    # p99 of under 1000 requests (80 here) has too few beyond it for an interval: the value alone
    assert len(tpot) < 1000
    assert _history_value(hist, "2026-11-02", "tpot_ms.p99") == (pytest.approx(np.percentile(tpot, 99)), None, None)
    att = _history_value(hist, "2026-11-02", "goodput.attainment")
    assert att[0] == 1.0  # the limits are loose: every request is good
    rps = _history_value(hist, "2026-11-02", "goodput.request_goodput_rps")
    assert rps[0] == pytest.approx(_history_value(hist, "2026-11-02", "throughput.requests_per_s")[0])
    runs, rows = _counts(hist)
    assert runs == 3 and rows > 3 * 20

    # same content again (even under another date): nothing new, same night
    code, stdout, _ = cli(capsys, *base, str(nights[2]), "--label", "date=2026-11-09")
    assert code == 0 and json.loads(stdout)["run_id"] == "2026-11-03" and not json.loads(stdout)["recorded"]
    assert _counts(hist) == (runs, rows)

    # a failed night: a file no ingestor reads; exit 2, history and run stores untouched
    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not a trace\n" * 5)
    stores = sorted(p.name for p in (hist / "runs").iterdir())
    code, _, err = cli(capsys, *base, str(bad), "--label", "date=2026-11-04")
    assert code == 2 and "Error:" in err
    assert _counts(hist) == (runs, rows)
    assert sorted(p.name for p in (hist / "runs").iterdir()) == stores

    # an SLO violation: exit 1, JUnit written; the night is recorded as failing its SLOs
    tight = tmp_path / "tight.toml"
    tight.write_text(FAIL_SLO)
    junit = tmp_path / "junit.xml"
    code, stdout, err = cli(
        capsys,
        *base[:-3],
        "--slo",
        str(tight),
        "--json",
        "--junit",
        str(junit),
        str(nights[3]),
        "--label",
        "date=2026-11-04",
    )
    res = json.loads(stdout)
    assert code == 1 and res["slo"]["passed"] is False and res["slo"]["failed"] == ["tpot_ms.p50 <= 0.001"]
    assert err.startswith(f"Error: night {res['run_id']}: SLO fail: tpot_ms.p50 <= 0.001"), err
    root = ET.parse(junit).getroot()
    audit_suite, cp_suite = root.findall("testsuite")
    assert int(audit_suite.get("failures")) == 1 and int(root.get("failures")) == 1
    # the root is the night's whether an SLO file gave the audit suite or not (it was "tracelat audit")
    assert root.get("name") == "tracelat nightly"
    # the suites name the night (the engine's run id is the same every night)
    assert audit_suite.get("name") == f"tracelat audit night {res['run_id']} (run bench)"
    assert cp_suite.get("name") == f"tracelat nightly change points {res['run_id']}"
    # one change-point check per statistic tested tonight, none failing (four nights: nothing to find)
    assert int(cp_suite.get("tests")) >= 18 and int(cp_suite.get("failures")) == 0
    assert int(root.get("tests")) == int(audit_suite.get("tests")) + int(cp_suite.get("tests"))

    # the next night's auto baseline skips the night that failed its SLOs
    code, stdout, _ = cli(capsys, *base, str(nights[4]), "--label", "date=2026-11-05")
    assert code == 0 and json.loads(stdout)["baseline"] == "2026-11-03"
    trend = (out / "index.html").read_text()
    for night in ("2026-11-01", "2026-11-05"):
        assert f'href="{night}/index.html"' in trend and (out / night / "index.html").is_file()


@pytest.mark.slow  # five nights end to end; CI runs it with -m slow (the default run stays near 5 minutes)
def test_labels_are_escaped_and_dates_checked(nights, tmp_path, capsys):
    hist, out = tmp_path / "hist", tmp_path / "out"
    hostile = '<script>alert("x")</script><!--'
    code, stdout, _ = cli(
        capsys,
        "nightly",
        str(nights[0]),
        "--history",
        str(hist),
        "--out",
        str(out),
        "--label",
        "date=2026-11-01",
        "--label",
        f"commit={hostile}",
    )
    assert code == 0
    page = (out / "index.html").read_text()
    assert hostile not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "Content-Security-Policy" in page and page.count("<script") == 3  # bundle, specs, embed code
    md = (out / "2026-11-01" / "nightly.md").read_text()
    assert "<script>" not in md
    # a second night on the same date gets the next id
    code, stdout, _ = cli(
        capsys,
        "nightly",
        str(nights[1]),
        "--history",
        str(hist),
        "--out",
        str(out),
        "--label",
        "date=2026-11-01",
        "--json",
    )
    assert code == 0 and json.loads(stdout)["run_id"] == "2026-11-01.2"
    for bad in (
        ["--label", "date=11/01/2026"],
        ["--label", "date="],  # an unset $DATE in a CI script: not today
        ["--label", "nokey"],
        ["--baseline", "no-such-night"],
    ):
        code, _, err = cli(capsys, "nightly", str(nights[2]), "--history", str(hist), *bad)
        assert code == 2 and err
    assert _counts(hist)[0] == 2
    # an id from a label or option cannot pick a folder outside the history and the output
    code, stdout, _ = cli(
        capsys,
        "nightly",
        str(nights[2]),
        "--history",
        str(hist),
        "--out",
        str(out),
        "--run-id",
        "../evil",
        "--label",
        "date=2026-11-02",
        "--json",
    )
    res = json.loads(stdout)
    assert code == 0 and res["run_id"] == "../evil"
    report = Path(res["files"]["report"]).resolve()
    assert report.parent.parent == out.resolve() and report.parent.name.startswith("_evil")
    assert [p.name for p in (hist / "runs").iterdir() if "evil" in p.name][0].startswith("_evil")
    assert not list(tmp_path.glob("evil*"))
    # control characters from a label reach neither the terminal nor the summary
    code, stdout, _ = cli(
        capsys,
        "nightly",
        str(nights[3]),
        "--history",
        str(hist),
        "--out",
        str(out),
        "--label",
        "date=2026-11-03",
        "--label",
        "engine=\x1b]0;pwned\x07vllm\r",
    )
    assert code == 0 and "vllm" in stdout
    assert not any(ord(c) < 32 and c not in "\t\n" or 0x7F <= ord(c) <= 0x9F for c in stdout)
    # a night dated before the latest would change the recorded nights' change points: refused
    before = _counts(hist)
    code, _, err = cli(capsys, "nightly", str(nights[4]), "--history", str(hist), "--label", "date=2026-11-02")
    assert code == 2 and "is before the history's latest night (2026-11-03)" in err, err
    assert _counts(hist) == before


@pytest.mark.long
def test_a_label_given_twice_is_refused(nights, tmp_path, capsys):
    """Two values of one key took the last one with nothing said; now the night is refused,
    naming the key, a new night or a re-run alike."""
    hist = tmp_path / "hist"
    args = ["nightly", str(nights[0]), "--history", str(hist)]
    code, _, err = cli(capsys, *args, "--label", "date=2026-11-01", "--label", "commit=a", "--label", "date=2026-11-02")
    assert code == 2 and err == (
        "Error: --label date given twice (date=2026-11-01, date=2026-11-02): give each key once\n"
    ), err
    assert not hist.exists()
    code, stdout, err = cli(capsys, *args, "--label", "date=2026-11-01", "--json")
    assert code == 0 and json.loads(stdout)["labels"]["date"] == "2026-11-01", err
    before = _counts(hist)
    code, _, err = cli(capsys, *args, "--label", "commit=a", "--label", "commit=a")
    assert code == 2 and "Error: --label commit given twice (commit=a, commit=a)" in err, err
    assert _counts(hist) == before


def test_an_slo_percentile_that_reads_as_100_fails_the_night(nights, tmp_path, capsys):
    """ttft_ms.p9999999999999999999 is the float 100.0: it was audited as the maximum under another
    name (and beside a max = limit, twice); the night is refused, naming the key."""
    slo = tmp_path / "slo.toml"
    slo.write_text("[slo]\nttft_ms.max = 60000\nttft_ms.p9999999999999999999 = 60000\n")
    hist = tmp_path / "hist"
    code, _, err = cli(capsys, "nightly", str(nights[0]), "--history", str(hist), "--slo", str(slo))
    assert code == 2 and err.startswith(
        f"Error: {slo}: [slo] ttft_ms.p9999999999999999999: p9999999999999999999 reads as 100: the 100th "
        "percentile is the largest value"
    ), err
    assert not hist.exists()


def test_failed_first_night_leaves_no_history(tmp_path, capsys):
    hist = tmp_path / "h"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "iteration"}\n')  # every line rejected: the night fails
    code, _, err = cli(capsys, "nightly", str(bad), "--history", str(hist))
    assert code == 2 and err.startswith("Error:"), err
    assert not hist.exists()
    # a failed night in an existing history changes nothing in it
    hist.mkdir()
    (hist / "keep.txt").write_text("mine")
    code, _, _ = cli(capsys, "nightly", str(bad), "--history", str(hist))
    assert code == 2 and sorted(p.name for p in hist.iterdir()) == ["keep.txt"]


@pytest.mark.slow  # nights end to end; CI runs it with -m slow (the default run stays near 5 minutes)
def test_a_night_whose_outputs_fail_is_not_recorded(nights, tmp_path, capsys):
    """Exit 2 leaves the history unchanged: a night whose report cannot be written is not in
    it, so a re-run records it and the next night is compared with it, not past it."""
    hist, out = tmp_path / "hist", tmp_path / "out"
    base = ["nightly", "--history", str(hist)]
    code, _, err = cli(capsys, *base, str(nights[0]), "--label", "date=2026-11-01", "--out", str(out))
    assert code == 0, err
    before = _counts(hist)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    code, _, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02", "--out", str(blocked / "out"))
    assert code == 2 and err.startswith("Error:"), err
    assert _counts(hist) == before and all(p.name.startswith("2026-11-01") for p in (hist / "runs").iterdir())
    code, stdout, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02", "--out", str(out), "--json")
    assert code == 0 and json.loads(stdout)["recorded"] is True, err
    assert _counts(hist)[0] == 2


@pytest.mark.long
def test_a_missing_baseline_store_is_named(nights, tmp_path, capsys):
    hist, out = tmp_path / "hist", tmp_path / "out"
    base = ["nightly", "--history", str(hist), "--out", str(out)]
    code, _, err = cli(capsys, *base, str(nights[0]), "--label", "date=2026-11-01")
    assert code == 0, err
    (store,) = (hist / "runs").glob("2026-11-01*.duckdb")
    store.unlink()
    code, _, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02")
    assert code == 2 and "the store of baseline night 2026-11-01" in err and "is missing" in err, err
    assert not store.exists()  # not made again as an empty store
    assert _counts(hist)[0] == 1


def _listing(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``, a file with a digest of its bytes."""
    import hashlib

    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def test_a_night_that_fails_writing_its_outputs_leaves_none(nights, tmp_path, capsys):
    """Exit 2 after the report was written (a baseline's store missing, an unwritable --junit or
    nightly.json) leaves no report folder of the night, and the trend page as it was."""
    hist, out = tmp_path / "hist", tmp_path / "out"
    base = ["nightly", "--history", str(hist), "--out", str(out)]
    code, _, err = cli(capsys, *base, str(nights[0]), "--label", "date=2026-11-01")
    assert code == 0, err
    before, recorded = _listing(out), _counts(hist)
    assert "2026-11-01/index.html" in before and "index.html" in before and "nightly.json" in before

    # --junit inside a file: fails after tonight's report and comparison were written
    (tmp_path / "a-file").write_text("not a folder")
    junit = tmp_path / "a-file" / "ci.xml"
    code, _, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02", "--junit", str(junit))
    assert code == 2 and "cannot write --junit" in err, err
    assert _listing(out) == before and _counts(hist) == recorded

    # nightly.json cannot be written: fails after the trend page was rewritten with tonight
    (out / "nightly.json").unlink()
    (out / "nightly.json").mkdir()
    before = _listing(out)
    code, _, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02")
    assert code == 2 and err.startswith("Error: cannot read or write"), err
    assert _listing(out) == before and _counts(hist) == recorded
    (out / "nightly.json").rmdir()

    # the baseline night's store is missing: fails after tonight's report was written
    (store,) = (hist / "runs").glob("2026-11-01*.duckdb")
    store.rename(tmp_path / "kept.duckdb")
    code, _, err = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02", "--out", str(tmp_path / "a" / "b"))
    assert code == 2 and "the store of baseline night 2026-11-01" in err, err
    assert not (tmp_path / "a").exists() and _counts(hist) == recorded
    # a re-run of the recorded night into another --out fails the same way: nothing left there,
    # and the history still names the report folder it was written to
    (tmp_path / "kept.duckdb").rename(store)
    code, _, _ = cli(capsys, *base, str(nights[1]), "--label", "date=2026-11-02")
    assert code == 0
    store.rename(tmp_path / "kept.duckdb")
    reports = _reports(hist)
    code, _, err = cli(capsys, *base[:-1], str(tmp_path / "c"), str(nights[1]))
    assert code == 2 and "the store of baseline night 2026-11-01" in err, err
    assert not (tmp_path / "c").exists() and _reports(hist) == reports


def _reports(hist: Path) -> list[tuple[str, str]]:
    con = duckdb.connect(str(hist / "history.duckdb"), read_only=True)
    try:
        return con.execute("select run_id, report from nightly_runs order by seq").fetchall()
    finally:
        con.close()


@pytest.mark.long
def test_a_failed_first_night_leaves_no_report_folder(nights, tmp_path, capsys):
    """A first night that fails writing its outputs, in a history folder that was there: only
    what was there before is left (not HISTORY/reports)."""
    hist = tmp_path / "h"
    hist.mkdir()
    (hist / "keep.txt").write_text("mine")
    (tmp_path / "a-file").write_text("not a folder")
    junit = tmp_path / "a-file" / "ci.xml"
    code, _, err = cli(capsys, "nightly", str(nights[0]), "--history", str(hist), "--junit", str(junit))
    assert code == 2 and "cannot write --junit" in err, err
    assert sorted(p.name for p in hist.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("content", [b"", b"\x00" * 4096, b"garbage " * 100])
def test_a_damaged_history_file_is_called_damaged_not_locked(nights, tmp_path, capsys, content):
    hist = tmp_path / "hist"
    hist.mkdir()
    (hist / "history.duckdb").write_bytes(content)
    code, _, err = cli(capsys, "nightly", str(nights[0]), "--history", str(hist))
    assert code == 2 and "cannot open the nightly history" in err, err
    assert "damaged" in err and "another nightly job" not in err


@pytest.mark.slow  # three nights end to end; CI runs it with -m slow (the default run stays near 5 minutes)
def test_trend_links_survive_moving_the_history(nights, tmp_path, capsys):
    """A history restored elsewhere (a CI cache): the trend page links every night's report
    in the moved folder, not in the old one."""
    import re
    import shutil
    from urllib.parse import unquote

    old = tmp_path / "old"
    for i in (0, 1):
        code, _, err = cli(
            capsys, "nightly", str(nights[i]), "--history", str(old), "--label", f"date=2026-11-0{i + 1}"
        )
        assert code == 0, err
    moved = tmp_path / "moved"
    shutil.move(str(old), str(moved))
    code, _, err = cli(capsys, "nightly", str(nights[2]), "--history", str(moved), "--label", "date=2026-11-03")
    assert code == 0, err
    page = moved / "reports" / "index.html"
    links = [unquote(h) for h in re.findall(r'href="([^"]+index\.html)"', page.read_text())]
    assert len(links) == 3 and all((page.parent / h).resolve().is_file() for h in links), links
    assert all("old" not in h for h in links)


@pytest.mark.parametrize(
    "name, content, why",
    [
        pytest.param("x.log", "garbage {\n", "skipped: no known format", marks=pytest.mark.slow),
        pytest.param(
            "trunc.jsonl",
            '{"kind":"request","req_id":"zz"\n',
            "all 1 records rejected, the first on line 1: not valid",
            marks=pytest.mark.slow,
        ),
        ("empty.jsonl", "", "no records in it"),
    ],
    ids=["unknown-format", "all-rejected", "empty"],
)
def test_a_folder_file_that_loads_nothing_fails_the_night(nights, tmp_path, capsys, name, content, why):
    """A file in tonight's folder that loads nothing fails the night as it does named on its own
    (and as `tracelat ingest` of the folder does): exit 2, the file named, the history unchanged."""
    import shutil

    hist, junit = tmp_path / "hist", tmp_path / "nightly.xml"
    code, _, err = cli(capsys, "nightly", str(nights[0]), "--history", str(hist), "--label", "date=2026-11-01")
    assert code == 0, err
    before, stores = _counts(hist), sorted(p.name for p in (hist / "runs").iterdir())
    folder = tmp_path / "tonight"
    folder.mkdir()
    shutil.copy(nights[1] / "trace.jsonl", folder / "trace.jsonl")
    (folder / name).write_text(content)
    args = ["nightly", "--history", str(hist), "--label", "date=2026-11-02", "--junit", str(junit)]
    for given in ([str(folder)], [str(folder / "trace.jsonl"), str(folder / name)]):
        code, _, err = cli(capsys, *args, *given)
        assert code == 2 and err.startswith("Error:"), (given, err)
        if name == "x.log" and len(given) == 2:  # named, it fails detection before any ingest
            assert f"{folder / name}: unknown format" in err, err
        else:
            assert f"1 of tonight's 2 file(s) loaded nothing: {folder / name} ({why}" in err, err
        assert _counts(hist) == before and sorted(p.name for p in (hist / "runs").iterdir()) == stores
        suite = ET.parse(junit).getroot()
        assert suite.get("errors") == "1" and name in suite.find(".//error").get("message"), ET.tostring(suite)
    # without the bad file the night is recorded
    (folder / name).unlink()
    code, stdout, err = cli(capsys, *args, str(folder), "--json")
    assert code == 0 and json.loads(stdout)["recorded"] is True, err
    assert ET.parse(junit).getroot().get("name") == "tracelat nightly"  # no SLO file: the same root name


@pytest.mark.long
def test_hidden_files_of_a_folder_are_skipped_and_not_in_the_digest(nights, tmp_path, capsys):
    """A folder walk skips hidden files (`.DS_Store`, an editor's swap file) as `tracelat ingest`
    does: they neither fail the night nor count in its input digest (a re-run without them is the
    same night)."""
    import shutil

    hist = tmp_path / "hist"
    folder = tmp_path / "tonight"
    folder.mkdir()
    shutil.copy(nights[0] / "trace.jsonl", folder / "trace.jsonl")
    (folder / ".DS_Store").write_bytes(b"\x00\x01binary")
    code, stdout, err = cli(
        capsys, "nightly", str(folder), "--history", str(hist), "--label", "date=2026-11-01", "--json"
    )
    assert code == 0 and json.loads(stdout)["recorded"] is True, err
    (folder / ".DS_Store").unlink()
    code, stdout, err = cli(
        capsys, "nightly", str(folder), "--history", str(hist), "--label", "date=2026-11-01", "--json"
    )
    assert code == 0 and json.loads(stdout)["recorded"] is False, err
    assert _counts(hist)[0] == 1


@pytest.mark.parametrize("names", [("a_today.jsonl", "b_yesterday.jsonl"), ("trace-1102.jsonl", "trace-1101.jsonl")])
@pytest.mark.long
def test_a_file_left_from_another_night_fails_the_night_not_passes_on_the_rest(nights, tmp_path, capsys, names):
    """Yesterday's trace left in tonight's folder: both name run 'bench', so the records of the one
    loaded second that repeat the other's step numbers and request ids are rejected as
    duplicates; the night passed on the rest, with nothing said. Which file loses its records
    depends on their order (date-stamped names load yesterday's first), so any such duplicate
    fails the night."""
    import shutil

    today, yesterday = names
    hist = tmp_path / "hist"
    folder = tmp_path / "tonight"
    folder.mkdir()
    shutil.copy(nights[0] / "trace.jsonl", folder / today)
    shutil.copy(nights[1] / "trace.jsonl", folder / yesterday)
    first, second = sorted(names)  # files of a folder load in name order
    code, _, err = cli(capsys, "nightly", str(folder), "--history", str(hist), "--label", "date=2026-11-01")
    assert code == 2 and err.startswith("Error: tonight's files repeat each other's records: "), err
    assert f"{folder / second}: " in err and f"of {folder / first}, another file: " in err, err
    assert "remove the one that is not tonight's" in err
    assert not hist.exists()  # a failed first night leaves no history


def test_two_copies_of_one_file_fail_the_night(nights, tmp_path, capsys):
    """Byte-for-byte copies: the second was skipped as already ingested and the night passed on
    the first, with nothing said, where docs/nightly.md says any duplicate fails it."""
    import shutil

    hist, folder = tmp_path / "hist", tmp_path / "tonight"
    folder.mkdir()
    for name in ("x.jsonl", "y.jsonl"):
        shutil.copy(nights[0] / "trace.jsonl", folder / name)
    code, _, err = cli(capsys, "nightly", str(folder), "--history", str(hist), "--label", "date=2026-11-01")
    assert code == 2 and err.startswith("Error: tonight's files repeat each other: "), err
    assert f"{folder / 'y.jsonl'} is a copy of {folder / 'x.jsonl'}" in err, err
    assert not hist.exists()


@pytest.mark.long
def test_rejected_lines_and_an_unaligned_source_are_warned_in_the_night(nights, tmp_path, capsys):
    """A night whose file lost a few lines (cut short, a garbled line) is recorded, and says so on
    stderr, in nightly.md and in --json; a re-run says the same."""
    import shutil

    hist, out = tmp_path / "hist", tmp_path / "out"
    folder = tmp_path / "tonight"
    folder.mkdir()
    text = (nights[0] / "trace.jsonl").read_text().splitlines()
    cut = len(text) - 3
    (folder / "trace.jsonl").write_text("\n".join(text[:cut] + ["not json at all", text[cut][:25]]))
    args = ["nightly", str(folder), "--history", str(hist), "--out", str(out), "--label", "date=2026-11-01"]
    for recorded in (True, False):
        code, stdout, err = cli(capsys, *args, "--json")
        assert code == 0, err
        doc = json.loads(stdout)
        assert doc["recorded"] is recorded
        (warning,) = doc["warnings"]
        assert warning.startswith(
            f"{folder / 'trace.jsonl'}: 2 of {cut + 2} lines rejected (the first, line {cut + 1}: "
        )
        assert "tracelat rejects --db " in warning
        assert f"warning: {warning}" in err
        md = Path(doc["files"]["summary_md"]).read_text()
        assert "### Warnings" in md and f"2 of {cut + 2} lines rejected" in md
    # a clean night has none
    shutil.copy(nights[1] / "trace.jsonl", folder / "trace.jsonl")
    code, stdout, err = cli(capsys, *args[:-1], "date=2026-11-02", "--json")
    assert code == 0 and json.loads(stdout)["warnings"] == [] and "warning:" not in err, err


@pytest.mark.long
def test_a_night_ended_by_sigterm_changes_nothing(tmp_path):
    """A CI timeout or cancel sends SIGTERM: Python's default ended the process where it stood,
    leaving the staged store behind and, late in the night, a night recorded without its report.
    Now it is undone as an error is (exit 143), here a first night: no history is left; and a
    staged store of a process that is gone (SIGKILL) is swept by the next night."""
    import os
    import signal
    import subprocess
    import sys
    import time

    hist, out = tmp_path / "hist", tmp_path / "out"
    (hist / "runs").mkdir(parents=True)
    # left by a night killed outright, its PID now another process's (this one): the history's lock
    # says no other night is staging, so it goes whoever holds the PID
    stale = hist / "runs" / f".staging-{os.getpid()}.duckdb"
    stale.write_bytes(b"left by a night killed outright")
    big = simulate_night(tmp_path / "big", seed=9, requests=1500)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "nightly", "--history", str(hist), "--out", str(out), str(big)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    staged = hist / "runs" / f".staging-{proc.pid}.duckdb"
    deadline = time.monotonic() + 60
    while not staged.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.fail(f"the night ended before it could be signalled: {proc.stderr.read()}")
    time.sleep(0.3)  # well into the night's ingest
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "Terminated.", stderr
    assert not staged.exists() and not stale.exists()
    assert sorted(p.name for p in hist.iterdir()) == []  # the history and its runs/ are gone
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.long
def test_a_label_that_replaces_the_runs_own_value_is_warned(nights, tmp_path, capsys):
    """`--label engine=...` silently replaced the engine the run's records give, on the trend page and
    in the history. It still wins (a label is the user's word), but the night warns, on stderr and in
    the JSON, also when re-run; a label equal to the run's own value, or a new key, says nothing."""
    hist = tmp_path / "hist"
    args = ["nightly", str(nights[0]), "--history", str(hist), "--json", "--label", "date=2026-11-01"]
    code, stdout, err = cli(capsys, *args, "--label", "engine=vllm", "--label", "team=infra")
    res = json.loads(stdout)
    assert code == 0 and res["labels"]["engine"] == "vllm", err
    said = [w for w in res["warnings"] if w.startswith("--label")]
    assert said == [
        "--label engine=vllm replaces the engine the run's records give (tracelat-sim); the history "
        "and the trend page show the label"
    ], res["warnings"]
    assert f"warning: {said[0]}" in err
    code, stdout, err = cli(capsys, *args, "--label", "engine=vllm", "--label", "team=infra")  # a re-run
    assert code == 0 and "warning: --label engine=vllm replaces" in err, err
    nxt = ["nightly", str(nights[1]), "--history", str(hist), "--json", "--label", "date=2026-11-02"]
    code, stdout, err = cli(capsys, *nxt, "--label", "engine=tracelat-sim", "--label", "team=infra")
    assert code == 0 and not [w for w in json.loads(stdout)["warnings"] if w.startswith("--label")], stdout


def test_a_night_of_steps_alone_is_warned(nights, tmp_path, capsys):
    """The bench client died (or its file was left out): the server's steps alone pass the night,
    whose request metrics are simply missing. It is recorded, and says so; a night with its
    requests says nothing of the kind."""
    hist, out = tmp_path / "hist", tmp_path / "out"
    folder = tmp_path / "steps-only"
    folder.mkdir()
    lines = (nights[0] / "trace.jsonl").read_text().splitlines()
    steps = [line for line in lines if '"kind":"request"' not in line.replace(" ", "")]
    assert 0 < len(steps) < len(lines)
    (folder / "trace.jsonl").write_text("\n".join(steps) + "\n")
    args = ["nightly", "--history", str(hist), "--out", str(out), "--json"]
    code, stdout, err = cli(capsys, *args, str(folder), "--label", "date=2026-11-01")
    assert code == 0, err
    n_steps = sum('"kind":"iteration"' in line.replace(" ", "") for line in steps)
    (warning,) = json.loads(stdout)["warnings"]
    assert warning.startswith(f"the night's run holds {n_steps} steps and no requests: no request latency")
    assert f"warning: {warning}" in err
    other = ["nightly", "--history", str(tmp_path / "h2"), "--out", str(tmp_path / "o2"), "--json"]
    code, stdout, err = cli(capsys, *other, str(nights[1]), "--label", "date=2026-11-02")
    assert code == 0 and json.loads(stdout)["warnings"] == [], err
