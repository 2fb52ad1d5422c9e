"""explain shows times as ISO with zone and seconds since the run's start; bad windows are errors
(issue 15 item 16)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline.cli import run_captured as cli

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    db = tmp_path_factory.mktemp("explain") / "v.duckdb"
    code, out = cli("ingest", FIX / "server_epoch.log", FIX / "requests.jsonl", "--run-id", "v", "--db", db)
    assert code == 0, out
    return db


def test_header_and_offenders_show_iso_and_offsets(db):
    code, out = cli("explain", "v", "--db", db, "--from", "1")
    assert code == 0, out
    head = out.splitlines()[0]
    assert head.endswith("(requests arriving 2026-11-30T04:47:28.949Z (+1.000 s) .. the end)"), head
    assert "None" not in out and "179601" not in out  # no Python None, no bare epoch seconds
    assert " ending 2026-11-30T" in out and " arrived 2026-11-30T" in out


def test_trailing_z_is_accepted(db):
    code, out = cli("explain", "v", "--db", db, "--from", "2026-11-30T04:47:29Z", "--to", "2026-11-30T04:47:31+00:00")
    assert code == 0, out
    assert "(requests arriving 2026-11-30T04:47:29.000Z (+1.050 s) .. 2026-11-30T04:47:31.000Z (+3.050 s))" in out


@pytest.mark.parametrize(
    "window,message",
    [
        (("--from", "3", "--to", "1"), "--from 3 is after --to 1"),
        (
            ("--from", "300"),
            "--from 300 lies after the run's end (the run spans 2026-11-30T04:47:27.949Z (+0.000 s) ..",
        ),
        (("--to", "@5"), "--to @5 lies before the run's start"),
        (("--from", "nan"), "time 'nan': not a finite number of seconds"),
        (("--to", "@inf"), "time '@inf': not a finite number of seconds"),
    ],
)
def test_reversed_or_outside_windows_are_errors(db, window, message):
    code, out = cli("explain", "v", "--db", db, *window)
    assert code == 2 and message in out, out


def test_show_time_on_a_monotonic_clock():
    from pipeline.fit.attribution import show_time

    assert show_time(1094.5, 1090.0, unix=False) == "+4.500 s"
    assert show_time(None, 1090.0, unix=False) == "-"


def test_fit_hardware_line_has_no_none():
    from pipeline.fit.result import FitResult
    from pipeline.fit.text import format_fit
    import dataclasses

    fields = {
        f.name: None
        for f in dataclasses.fields(FitResult)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    hw = {"model": None, "gpu": "H100", "num_gpus": None, "weight_dtype": None, "kv_dtype": None}
    f = FitResult(
        **{
            **fields,
            "run_id": "r",
            "n_iterations": 0,
            "n_fitted": 0,
            "hardware": hw,
            "phases": {},
            "claims": [],
            "spikes": {},
            "stall_ms": {},
            "statements": [],
        }
    )
    text = format_fit(f)
    assert "hardware: model ?, GPU H100 x?, weights ?, KV ?" in text and "None" not in text


@pytest.mark.long
def test_times_of_day_are_read_in_the_zone_of_the_log(tmp_path):
    """A log read with --tz Europe/Berlin shows 04:47; --from 04:47:29 means that wall time, not
    04:47:29 UTC (an hour after the run: it used to say the window lies after the run's end)."""
    db = tmp_path / "tz.duckdb"
    code, out = cli(
        "ingest", FIX / "server.log", FIX / "bench.json", "--run-id", "tz", "--tz", "Europe/Berlin", "--db", db
    )
    assert code == 0, out
    code, local = cli("explain", "tz", "--db", db, "--from", "04:47:29", "--to", "04:47:31")
    assert code == 0, local
    code, utc = cli("explain", "tz", "--db", db, "--from", "2026-11-30T03:47:29Z", "--to", "2026-11-30T03:47:31Z")
    assert code == 0, utc
    assert local.splitlines()[0] == utc.splitlines()[0]
    assert "(requests arriving 2026-11-30T03:47:29.000Z" in local.splitlines()[0]
    code, out = cli("explain", "tz", "--db", db, "--from", "2026-11-30T04:48:00")  # naive ISO: the log's zone too
    assert code == 2 and "lies after the run's end" in out, out
    assert "in Europe/Berlin, the log's zone: 2026-11-30 04:47:" in out, out


def test_runs_with_only_requests_or_only_steps(tmp_path):
    """A client's records alone: no "preemptions None" per request (nothing says how often they were
    preempted). A server log alone: the run has no requests, which is not a window's fault."""
    db = tmp_path / "one.duckdb"
    code, out = cli("ingest", FIX / "bench.json", "--run-id", "client", "--db", db)
    assert code == 0, out
    code, out = cli("explain", "client", "--db", db)
    assert code == 0, out
    assert "worst requests:" in out and "None" not in out, out
    code, out = cli("ingest", FIX / "server_epoch.log", "--run-id", "server", "--db", db)
    assert code == 0, out
    code, out = cli("explain", "server", "--db", db)
    assert code == 0, out
    assert "the run has no requests with a ttft value" in out and "window" not in out, out


def test_times_of_day_on_a_run_over_midnight(tmp_path):
    """A run from 23:59:5x to 00:00:0x: 00:00:01 is the next day's (it was taken on the start's
    day, a day before the run, and --from 23:59:58 --to 00:00:01 was 'from after to')."""
    import datetime as dt
    import os
    import re

    shift = dt.datetime(2027, 1, 1) - dt.datetime(2026, 11, 30, 4, 47, 30)

    def moved(m):
        t = dt.datetime.strptime(f"2026-{m.group(1)}", "%Y-%m-%d %H:%M:%S") + shift
        return t.strftime("%m-%d %H:%M:%S")

    log = tmp_path / "server.log"
    log.write_text(re.sub(r"(?<=INFO )(\d\d-\d\d \d\d:\d\d:\d\d)", moved, (FIX / "server.log").read_text()))
    written = dt.datetime(2027, 1, 1, 1, tzinfo=dt.timezone.utc).timestamp()
    os.utime(log, (written, written))
    db = tmp_path / "ny.duckdb"
    code, out = cli("ingest", log, FIX / "bench.json", "--run-id", "ny", "--tz", "UTC", "--db", db)
    assert code == 0, out
    code, out = cli("explain", "ny", "--db", db, "--from", "00:00:00", "--to", "00:00:02")
    assert code == 0, out
    assert "(requests arriving 2027-01-01T00:00:00.000Z" in out.splitlines()[0], out
    code, out = cli("explain", "ny", "--db", db, "--from", "23:59:58", "--to", "00:00:01")
    assert code == 0, out
    assert "2026-12-31T23:59:58.000Z" in out.splitlines()[0] and "2027-01-01T00:00:01.000Z" in out.splitlines()[0]


@pytest.mark.parametrize("limit", [2, 7])
def test_the_text_lists_as_many_as_limit_asks(db, limit):
    """--limit 10 (the default) or 20 listed 5 steps and 5 requests in the text; --json had them all."""
    code, out = cli("explain", "v", "--db", db, "--limit", str(limit))
    assert code == 0, out
    lines = out.splitlines()
    steps = [x for x in lines if x.startswith("    iter ")]
    requests = lines[lines.index("  worst requests:") + 1 :]
    requests = [x for x in requests if x.startswith("    ") and " arrived " in x]
    assert len(steps) == limit and len(requests) == limit, out
