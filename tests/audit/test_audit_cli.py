"""SLO files, exit codes, JUnit XML and the Markdown verdict."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pipeline.audit import audit, junit_xml, load_slo, markdown_report, parse_slo
from pipeline.metrics import percentile_of
from pipeline.cli import main
from pipeline.errors import InputError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slo.toml"
PASSING = """
[slo]
ttft_ms.p99 = 200
tpot_ms.max = 30
[goodput]
ttft_ms = 100
tpot_ms = 12
min_attainment = 0.5
[fluidity]
ttft_deadline_ms = 100
tbt_deadline_ms = 10
min_index_p01 = 0.25
"""
FAILING = PASSING.replace("ttft_ms.p99 = 200", "ttft_ms.p99 = 100").replace(
    "min_attainment = 0.5", "min_attainment = 0.9"
)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def junit_counts(path: Path) -> tuple[int, int, int, list[str]]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    errors = sum(c.find("error") is not None for c in cases)
    assert int(suite.get("failures")) == len(failed) and int(suite.get("errors")) == errors
    return len(cases), len(failed), errors, failed


def test_pass_and_fail_files_exit_codes_and_junit(tiny_run, tmp_path, capsys):
    _, db = tiny_run
    ok_file, bad_file = tmp_path / "ok.toml", tmp_path / "bad.toml"
    ok_file.write_text(PASSING)
    bad_file.write_text(FAILING)
    code, out, _ = cli(
        capsys, "audit", "aud", "--slo", str(ok_file), "--db", str(db), "--junit", str(tmp_path / "ok.xml")
    )
    assert code == 0, out
    assert junit_counts(tmp_path / "ok.xml") == (4, 0, 0, [])
    code, out, err = cli(
        capsys, "audit", "aud", "--slo", str(bad_file), "--db", str(db), "--junit", str(tmp_path / "bad.xml")
    )
    assert code == 1
    # the one error path (CheckFailed), not a bare exit: stderr names what failed
    assert err == "Error: run aud: 2 SLO(s) violated: ttft_ms.p99 <= 100, goodput attainment >= 0.9\n"
    n, failed, errors, names = junit_counts(tmp_path / "bad.xml")
    assert (n, failed, errors) == (4, 2, 0)
    assert names == ["ttft_ms.p99 <= 100", "goodput attainment >= 0.9"]
    p99 = np.percentile([50, 20, 153, 90, 30], 99)
    assert f"[ FAIL] ttft_ms.p99 <= 100 = {p99:.3f} ms exceeds limit <= 100.000 ms" in out


def test_json_output_values(tiny_run, tmp_path, capsys):
    _, db = tiny_run
    f = tmp_path / "ok.toml"
    f.write_text(PASSING)
    code, out, _ = cli(capsys, "audit", "aud", "--slo", str(f), "--db", str(db), "--json")
    res = json.loads(out)
    assert code == 0 and res["verdict"] == "pass" and res["exit_code"] == 0
    by_name = {c["name"]: c for c in res["checks"]}
    assert by_name["tpot_ms.max <= 30"]["observed"] == pytest.approx(26)
    assert by_name["goodput attainment >= 0.5"]["observed"] == pytest.approx(0.5)
    assert by_name["fluidity index p01 >= 0.25"]["observed"] == pytest.approx(np.percentile([3 / 13, 1, 1, 1], 1))


def test_unevaluable_slo_is_exit_2(make_store, db_path, tmp_path, capsys):
    reqs = [
        {
            "req_id": "a",
            "t_arrival": 0,
            "t_scheduled": 0,
            "t_first_token": 0.1,
            "t_finish": 0.2,
            "prompt_tokens": 1,
            "output_tokens": 3,
        }
    ]
    make_store("notokens", reqs).close()
    f = tmp_path / "itl.toml"
    f.write_text("[slo]\nitl_ms.p99 = 50\nttft_ms.p50 = 1000\n")
    code, out, err = cli(
        capsys, "audit", "notokens", "--slo", str(f), "--db", str(db_path), "--junit", str(tmp_path / "j.xml")
    )
    assert code == 2 and "no token times" in out
    assert err == "Error: run notokens: the run's data cannot evaluate 1 SLO(s): itl_ms.p99 <= 50\n"
    assert junit_counts(tmp_path / "j.xml")[:3] == (2, 0, 1)
    # with a violation beside it: still exit 2 (the verdict is incomplete), and the violation is named
    f.write_text("[slo]\nitl_ms.p99 = 50\nttft_ms.p50 = 1\n")
    code, out, err = cli(capsys, "audit", "notokens", "--slo", str(f), "--db", str(db_path))
    assert code == 2
    assert err == (
        "Error: run notokens: the run's data cannot evaluate 1 SLO(s): itl_ms.p99 <= 50; "
        "and 1 SLO(s) violated: ttft_ms.p50 <= 1\n"
    ), err


def test_usage_errors_exit_2(tiny_run, tmp_path, capsys):
    _, db = tiny_run
    code, _, err = cli(capsys, "audit", "aud", "--slo", str(tmp_path / "missing.toml"), "--db", str(db))
    assert code == 2 and err.startswith("Error: SLO file") and "does not exist" in err
    f = tmp_path / "ok.toml"
    f.write_text(PASSING)
    code, _, err = cli(capsys, "audit", "nope", "--slo", str(f), "--db", str(db))
    assert code == 2 and "run 'nope' is not in the store" in err


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[slo]\nttft_ms.p99 = \n", "invalid TOML"),
        ("[slo]\nttfx_ms.p99 = 5\n", "[slo] ttfx_ms.p99: unknown metric 'ttfx_ms'"),
        # p100 reads as p10.0, so no percentile; meant as the largest value, as p9999999999999999999 is
        (
            "[slo]\nttft_ms.p100 = 5\n",
            "[slo] ttft_ms.p100: p100: the 100th percentile is the largest value; write ttft_ms.max",
        ),
        # 99.99999999999999999 is the float 100.0, the largest value; 99.99999 rounds to it in a name
        (
            "[slo]\nttft_ms.p9999999999999999999 = 5\n",
            "[slo] ttft_ms.p9999999999999999999: p9999999999999999999 reads as 100: the 100th percentile is the "
            "largest value; a percentile must be below 100 (at most p999999 = 99.9999); write ttft_ms.max",
        ),
        ('[slo]\n"e2e_ms.p9999999" = 5\n', "e2e_ms.p9999999: p9999999 reads as 99.99999, 100 at the 4 decimals"),
        (
            "[fluidity]\nttft_deadline_ms = 5\ntbt_deadline_ms = 1\nmin_index_p99999999 = 0.5\n",
            "[fluidity] min_index_p99999999: p99999999 reads as 99.999999, 100 at the 4 decimals",
        ),
        # 0.000001 rounds to 0 in a name (p00): the smallest value under another name, beside min
        (
            "[slo]\nttft_ms.p00000001 = 9\nttft_ms.min = 5\n",
            "written twice (ttft_ms.p00000001 and ttft_ms.min are the same statistic)",
        ),
        ('[slo]\nttft_ms.p99 = "fast"\n', "expected a number, got 'fast'"),
        ("[slo]\nttft_ms.p99 = true\n", "expected a number, got True"),
        ("[slos]\nttft_ms.p99 = 5\n", "[slos]: unknown section"),
        ("[goodput]\nmin_attainment = 0.9\n", "needs at least one per-request limit"),
        ("[goodput]\nttft_ms = 5\nmin_attainment = 99\n", "fraction between 0 and 1"),
        ("[goodput]\nitl_ms = 5\n", "[goodput] itl_ms: unknown key"),
        ("[fluidity]\nttft_deadline_ms = 5\n", "missing tbt_deadline_ms"),
        ("[fluidity]\nttft_deadline_ms = 5\ntbt_deadline_ms = 0\n", "must be > 0"),
        ("[fluidity]\nttft_deadline_ms = 5\ntbt_deadline_ms = 1\nmin_p01 = 1\n", "[fluidity] min_p01: unknown key"),
        ("# nothing\n", "holds no SLOs"),
    ],
)
def test_slo_file_errors(tmp_path, text, fragment):
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(InputError) as exc:
        load_slo(f)
    assert fragment in str(exc.value) and str(f) in str(exc.value)


def test_the_highest_percentile_below_100_is_not_max():
    spec = parse_slo({"slo": {"ttft_ms": {"p999999": 5, "max": 6}}})
    assert [(lim.stat, lim.limit) for lim in spec.limits] == [("p999999", 5), ("max", 6)]
    assert percentile_of("p999999") == 99.9999


def test_toml_error_names_line(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[slo]\nttft_ms.p99 = 1\nbroken line\n")
    with pytest.raises(InputError, match="line 3"):
        load_slo(f)


def test_example_file_parses_as_documented():
    spec = load_slo(EXAMPLE)
    assert [(l.metric, l.stat, l.limit) for l in spec.limits] == [
        ("ttft_ms", "p99", 2000),
        ("tpot_ms", "p99", 100),
        ("itl_ms", "p999", 500),
    ]
    assert spec.goodput.limits == {"ttft_ms": 2000, "tpot_ms": 100} and spec.goodput.min_attainment == 0.99
    assert (spec.fluidity.ttft_deadline_ms, spec.fluidity.tbt_deadline_ms) == (2000, 100)
    assert spec.fluidity.minima == {"p01": 0.9}


def test_quoted_dotted_keys_equal_nested():
    a = parse_slo({"slo": {"ttft_ms.p99": 5}})
    b = parse_slo({"slo": {"ttft_ms": {"p99": 5}}})
    assert a.limits == b.limits


@pytest.mark.parametrize(
    "name, pct",
    [
        ("p99", 99),
        ("p999", 99.9),
        ("p01", 1),
        ("p1", 1),
        ("p05", 5),
        ("p50", 50),
        ("p001", 0.1),
        ("p9999", 99.99),
        ("p0", 0),
        ("p100", None),
        ("mean", None),
    ],
)
def test_percentile_names(name, pct):
    assert percentile_of(name) == pct


def test_hostile_run_id_in_junit_and_markdown(make_store, tmp_path):
    rid = 'x</testcase><script>alert("1")</script> | `code` \x01 ' + "é" * 300
    reqs = [
        {
            "req_id": "a",
            "t_arrival": 0,
            "t_scheduled": 0,
            "t_first_token": 0.1,
            "t_finish": 0.2,
            "prompt_tokens": 1,
            "output_tokens": 3,
            "token_times": [0.1, 0.15, 0.2],
        }
    ]
    # ingest refuses a run id with a control character now; stores written before may hold one
    con = make_store("hostile", [{**r, "run_id": "hostile"} for r in reqs])
    tables = con.execute(
        "select distinct table_name from duckdb_columns() where column_name = 'run_id' "
        "and table_name in (select table_name from duckdb_tables())"
    ).fetchall()
    for (table,) in tables:
        con.execute(f"update \"{table}\" set run_id = ? where run_id = 'hostile'", [rid])
    f = tmp_path / "ok.toml"
    f.write_text("[slo]\nttft_ms.p99 = 50\n")
    res = audit(con, rid, load_slo(f))
    root = ET.fromstring(junit_xml(res))
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["run_id"] == rid.replace("\x01", "\ufffd")  # round-trips, minus the control character
    assert len(list(root.iter("testcase"))) == 1 and len(list(root.iter("failure"))) == 1
    md = markdown_report(res)
    assert "<script>" not in md and "</testcase>" not in md and "\\<script\\>" in md
    assert "\\|" in md and "\\`code\\`" in md


STALE_JUNIT = (
    '<testsuites tests="1" failures="0"><testsuite name="x" tests="1"><testcase name="ok"/></testsuite></testsuites>'
)


def _error_junit(path: Path) -> str:
    """The message of the one <error> testcase a failed command leaves in its --junit file."""
    root = ET.parse(path).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("1", "0", "1")
    (case,) = root.iter("testcase")
    (error,) = case.findall("error")
    return error.get("message")


@pytest.mark.parametrize("why", ["no store", "unknown run", "bad SLO file", "missing --slo"])
def test_exit_2_rewrites_a_stale_junit_file(tiny_run, tmp_path, capsys, why):
    """An audit that fails (exit 2) before its verdict replaces the --junit file with an <error>
    naming the failure: CI must not show an earlier run's passing file."""
    _, db = tiny_run
    junit = tmp_path / "audit.xml"
    junit.write_text(STALE_JUNIT)
    ok, bad = tmp_path / "ok.toml", tmp_path / "bad.toml"
    ok.write_text(PASSING)
    bad.write_text("[slo\n")
    args, fragment = {
        "no store": (["aud", "--slo", str(ok), "--db", str(tmp_path / "none.duckdb")], "does not exist"),
        "unknown run": (["nope", "--slo", str(ok), "--db", str(db)], "run 'nope' is not in the store"),
        "bad SLO file": (["aud", "--slo", str(bad), "--db", str(db)], "invalid TOML"),
        "missing --slo": (["aud", "--db", str(db)], "Missing option '--slo'"),  # refused by click
    }[why]
    code, _, err = cli(capsys, "audit", *args, "--junit", str(junit))
    assert code == 2 and fragment in err, err
    message = _error_junit(junit)
    assert message.startswith("tracelat audit failed: ") and fragment in message, message


def test_a_latency_at_its_limit_meets_it_through_float_rounding(make_store, tmp_path, capsys):
    """Epoch-second stamps 0.7 s apart read 700.0000477 ms (their float spacing is 0.24 us): an SLO
    of 700 ms failed it. Within 1 us of the limit is within it; 2 us over still fails."""
    t0 = 1_767_225_600.0
    reqs = [
        {
            "req_id": f"q{i}",
            "t_arrival": t0 + i,
            "t_first_token": t0 + i + 0.7,
            "t_finish": t0 + i + 0.7 + 0.7,
            "prompt_tokens": 10,
            "output_tokens": 2,
            "token_times": [t0 + i + 0.7, t0 + i + 1.4],
        }
        for i in range(3)
    ]
    make_store("edge", reqs)
    db = tmp_path / "t.duckdb"
    ttft_ms = (reqs[0]["t_first_token"] - reqs[0]["t_arrival"]) * 1000
    assert 700 < ttft_ms < 700.001  # what the store holds: over the limit by float rounding alone
    slo = tmp_path / "edge.toml"
    slo.write_text("[slo]\nttft_ms.max = 700\ntpot_ms.p99 = 700\n[goodput]\nttft_ms = 700\nmin_attainment = 1\n")
    code, out, err = cli(capsys, "audit", "edge", "--slo", str(slo), "--db", str(db), "--json")
    assert code == 0, out + err
    got = {c["name"]: c["status"] for c in json.loads(out)["checks"]}
    assert set(got.values()) == {"pass"} and len(got) == 3
    slo.write_text("[slo]\nttft_ms.max = 699.998\n[goodput]\nttft_ms = 699.998\nmin_attainment = 1\n")
    code, out, _ = cli(capsys, "audit", "edge", "--slo", str(slo), "--db", str(db), "--json")
    assert code == 1 and {c["status"] for c in json.loads(out)["checks"]} == {"fail"}
