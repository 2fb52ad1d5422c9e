"""SLO files that set one SLO twice, hold nonsensical limits or a section with nothing to
check are refused through the CLI: one ``Error:`` line naming the file and the key, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.audit import load_slo
from pipeline.cli import main

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
FLUIDITY = "[fluidity]\nttft_deadline_ms = 100\ntbt_deadline_ms = 10\n"


def audit_file(tiny_run, tmp_path, capsys, text: str) -> tuple[int, str, str]:
    """``tracelat audit aud --slo FILE`` on the tiny run: (exit code, stderr, the file's path)."""
    _, db = tiny_run
    f = tmp_path / "q.toml"
    f.write_text(text)
    try:
        main(["audit", "aud", "--slo", str(f), "--db", str(db)])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err, str(f)


def assert_file_error(code: int, err: str, path: str, *fragments: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], err


@pytest.mark.parametrize(
    "text, key, fragments",
    [
        # the reviewer's file: without the check the quoted 6000 silently replaced the 100 (exit 0)
        ('[slo]\nttft_ms.p99 = 100\n"ttft_ms.p99" = 6000\n', "ttft_ms.p99", ['"ttft_ms.p99" = 6000', "= 100"]),
        ('[slo]\n"ttft_ms.p99" = 6000\nttft_ms.p99 = 100\n', "ttft_ms.p99", ['"ttft_ms.p99" = 6000', "= 100"]),
        ('[slo.ttft_ms]\np99 = 100\n[slo]\n"ttft_ms.p99" = 6000\n', "ttft_ms.p99", ['"ttft_ms.p99" = 6000']),
        ('[slo]\ntpot_ms = { max = 100 }\n"tpot_ms.max" = 6000\n', "tpot_ms.max", []),
        # the same statistic under two spellings: two checks of one SLO, the looser one a decoy
        ("[slo]\nttft_ms.p99 = 100\nttft_ms.p990 = 6000\n", "ttft_ms.p990", ["ttft_ms.p99 and ttft_ms.p990"]),
        ("[slo]\nttft_ms.p1 = 100\nttft_ms.p01 = 6000\n", "ttft_ms.p01", ["ttft_ms.p1 and ttft_ms.p01"]),
        (FLUIDITY + "min_index_p1 = 0.9\nmin_index_p01 = 0.1\n", "[fluidity] min_index_p01", ["min_index_p1 and"]),
        # the 0th percentile is the minimum
        ("[slo]\nitl_ms.min = 100\nitl_ms.p00 = 6000\n", "itl_ms.p00", ["itl_ms.min and itl_ms.p00"]),
        (FLUIDITY + "min_index_p0 = 0.9\nmin_index_min = 0.1\n", "[fluidity] min_index_min", ["min_index_p0 and"]),
    ],
)
def test_an_slo_written_twice_is_refused(tiny_run, tmp_path, capsys, text, key, fragments):
    code, err, path = audit_file(tiny_run, tmp_path, capsys, text)
    assert_file_error(code, err, path, key, "written twice", "keep one", *fragments)


def test_the_same_metric_with_other_statistics_is_not_a_duplicate(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[slo]\nttft_ms.p99 = 100\n"ttft_ms.p50" = 50\n[slo.tpot_ms]\np99 = 30\nmax = 60\n')
    assert [lim.name for lim in load_slo(f).limits] == ["ttft_ms.p99", "ttft_ms.p50", "tpot_ms.p99", "tpot_ms.max"]


@pytest.mark.parametrize(
    "text, key, fragment",
    [
        ("[slo]\nttft_ms.p99 = -5\n", "[slo] ttft_ms.p99", "must be > 0, got -5"),
        ("[slo]\nttft_ms.p99 = 0\n", "[slo] ttft_ms.p99", "must be > 0, got 0"),
        ("[slo]\ne2e_ms.mean = -0.5\n", "[slo] e2e_ms.mean", "must be > 0"),
        ("[slo]\nqueue_ms.max = 0\n", "[slo] queue_ms.max", "must be > 0"),
        ("[slo]\nttft_ms.std = -1\n", "[slo] ttft_ms.std", ">= 0 ms, got -1"),
        ("[goodput]\nttft_ms = -1\nmin_attainment = 0.5\n", "[goodput] ttft_ms", "must be > 0, got -1"),
        ("[goodput]\ntpot_ms = 0\nmin_attainment = 0.5\n", "[goodput] tpot_ms", "must be > 0, got 0"),
        ("[goodput]\nttft_ms = 100\nmin_request_goodput_rps = -1\n", "[goodput] min_request_goodput_rps", ">= 0"),
        ("[goodput]\nttft_ms = 100\nmin_token_goodput_tps = -1\n", "[goodput] min_token_goodput_tps", ">= 0"),
        ("[goodput]\nttft_ms = 100\nmin_attainment = -0.1\n", "[goodput] min_attainment", "between 0 and 1"),
        ("[goodput]\nttft_ms = 100\nmin_attainment = 1.5\n", "[goodput] min_attainment", "between 0 and 1"),
        ("[fluidity]\nttft_deadline_ms = -100\ntbt_deadline_ms = 10\n", "[fluidity] ttft_deadline_ms", "> 0"),
        (FLUIDITY + "min_index_p01 = 1.5\n", "[fluidity] min_index_p01", "between 0 and 1"),
        (FLUIDITY + "min_index_mean = -0.1\n", "[fluidity] min_index_mean", "between 0 and 1"),
        # TOML integers have no bound: one beyond a double's range was an internal error (exit 3)
        ("[slo]\nttft_ms.p99 = 1" + "0" * 400 + "\n", "[slo] ttft_ms.p99", "an integer of 401 digits"),
        ("[goodput]\nttft_ms = -1" + "0" * 400 + "\nmin_attainment = 0.5\n", "[goodput] ttft_ms", "finite number"),
        (FLUIDITY + "min_index_p1 = 9" + "0" * 400 + "\n", "[fluidity] min_index_p1", "finite number"),
    ],
)
def test_a_limit_out_of_range_is_a_file_error(tiny_run, tmp_path, capsys, text, key, fragment):
    code, err, path = audit_file(tiny_run, tmp_path, capsys, text)
    assert_file_error(code, err, path, key, fragment)


@pytest.mark.parametrize(
    "text",
    [
        "[slo]\nttft_ms.std = 0\n",  # "no spread at all": strict, but a meaningful upper limit
        "[slo]\nttft_ms.p99 = 0.001\n",
        "[goodput]\nttft_ms = 100\nmin_attainment = 0\nmin_request_goodput_rps = 0\nmin_token_goodput_tps = 0\n",
        "[goodput]\nttft_ms = 100\nmin_attainment = 1\n",
        FLUIDITY + "min_index_min = 0\nmin_index_mean = 1\n",
    ],
)
def test_limits_on_the_edge_of_their_range_load(tmp_path, text):
    f = tmp_path / "s.toml"
    f.write_text(text)
    assert not load_slo(f).empty


def test_fluidity_deadlines_without_a_limit_are_refused(tiny_run, tmp_path, capsys):
    # without the check: "PASS (0 checks)", exit 0, for a file that checks nothing
    code, err, path = audit_file(tiny_run, tmp_path, capsys, FLUIDITY)
    assert_file_error(code, err, path, "[fluidity]", "no lower limit", "min_index_p01 = 0.9")
    # also beside other SLOs: the section would be measured but never checked
    code, err, path = audit_file(tiny_run, tmp_path, capsys, "[slo]\nttft_ms.p99 = 6000\n" + FLUIDITY)
    assert_file_error(code, err, path, "[fluidity]", "no lower limit")


def test_goodput_limits_without_a_minimum_still_load(tmp_path):
    # deliberate: replay --slo compares goodput observed vs replayed and nightly tracks it from such a section
    f = tmp_path / "s.toml"
    f.write_text("[goodput]\nttft_ms = 100\ntpot_ms = 12\n")
    g = load_slo(f).goodput
    assert g.limits == {"ttft_ms": 100, "tpot_ms": 12} and g.min_attainment is None


def test_audit_of_a_file_that_checks_nothing_is_refused(tiny_run, tmp_path, capsys):
    # such a file loads (above) but an audit of it passed any run: "PASS (0 checks)", exit 0
    code, err, path = audit_file(tiny_run, tmp_path, capsys, "[goodput]\nttft_ms = 100\n")
    assert_file_error(code, err, path, "sets no limit to check", "min_attainment")
    # a minimum, or a limit elsewhere, is something to check
    code, err, _ = audit_file(tiny_run, tmp_path, capsys, "[goodput]\nttft_ms = 100\nmin_attainment = 0\n")
    assert code == 0, err
    code, err, _ = audit_file(tiny_run, tmp_path, capsys, "[goodput]\nttft_ms = 100\n[slo]\nttft_ms.p99 = 1e9\n")
    assert code == 0, err


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(example):
    assert not load_slo(example).empty


def test_fleet_slo_that_checks_nothing_is_refused(tmp_path, capsys):
    f = tmp_path / "g.toml"
    f.write_text("[goodput]\nttft_ms = 100\n")
    (tmp_path / "lake").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["fleet", str(tmp_path / "lake"), "--slo", str(f)])
    assert exc.value.code == 2
    assert_file_error(2, capsys.readouterr().err, str(f), "sets no limit to check")


def test_a_byte_order_mark_is_not_a_toml_error(tmp_path):
    """Editors on Windows save UTF-8 with a byte order mark; TOML's parser calls it an invalid statement."""
    f = tmp_path / "s.toml"
    f.write_bytes("\ufeff[slo]\nttft_ms.p99 = 100\n".encode())
    assert [lim.name for lim in load_slo(f).limits] == ["ttft_ms.p99"]
