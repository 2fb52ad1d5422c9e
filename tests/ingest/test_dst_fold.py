"""Zone-less log stamps through a DST fall-back (Europe/Berlin, 26 Oct 2025: 03:00 CEST -> 02:00 CET).

The hour 02:00-03:00 comes twice. Read as its earlier instant every time, the lines after the
change went an hour back: SGLang rejected each as "stamped 3598 s before an earlier line",
vLLM a step with a negative duration. A log runs forward, so where the earlier reading goes
back and the later one does not, the later one is the time; a log really out of order is
still rejected.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pipeline import store
from pipeline.ingest import reader

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
BERLIN = ZoneInfo("Europe/Berlin")
UTC = dt.timezone.utc
CHANGE = dt.datetime(2025, 10, 26, 1, 0, 0, tzinfo=UTC)  # 03:00 CEST becomes 02:00 CET


def _sglang_line(t: dt.datetime, k: int) -> str:
    """A decode line stamped with ``t`` on Berlin's wall clock (its token count makes it unique)."""
    wall = t.astimezone(BERLIN).strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"[{wall}] Decode batch. #running-req: 2, #token: {500 + 40 * k}, token usage: 0.03, "
        "cuda graph: True, gen throughput (token/s): 70.00, #queue-req: 0,"
    )


def _ingest(tmp_path: Path, name: str, text: str, written: float | None = None, tz: str = "Europe/Berlin"):
    path = tmp_path / name
    path.write_text(text)
    if written is not None:
        os.utime(path, (written, written))
    con = store.connect(tmp_path / f"{name}.duckdb")
    (res,) = load(con, path, tz=tz)
    return res, con


@pytest.mark.parametrize("batch_bytes", [None, 300])  # 300: about a line a batch, the change between two
@pytest.mark.long
def test_sglang_log_through_the_fall_back_keeps_every_line(tmp_path, monkeypatch, batch_bytes):
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    times = [CHANGE + dt.timedelta(seconds=2 * i - 61) for i in range(60)]
    text = "\n".join(_sglang_line(t, k) for k, t in enumerate(times)) + "\n"
    assert "[2025-10-26 02:59:59]" in text and "[2025-10-26 02:00:01]" in text  # the wall clock went back
    res, con = _ingest(tmp_path, "sgl.log", text)
    assert (res.format, res.accepted, res.rejected) == ("sglang-log", 60, 0)
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == [t.timestamp() for t in times]
    meta = con.execute("select meta->>'$.timestamps_time_zone' from runs").fetchone()[0]
    assert meta == "Europe/Berlin"


@pytest.mark.parametrize("batch_bytes", [None, 300])
def test_vllm_default_log_through_the_fall_back_keeps_its_timeline(tmp_path, monkeypatch, batch_bytes):
    """server.log's steps moved so that the clock goes back between two of them: the same
    steps, the same rebuilt timeline as the log read in UTC, an instant apart."""
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    written = dt.datetime(2025, 12, 1, tzinfo=UTC).timestamp()
    text = (FIX / "server.log").read_text()
    # the recording's 04:47:30 (UTC, 30 Nov) becomes 00:59:59 UTC, the last second before the change
    shift = dt.datetime(2025, 10, 26, 0, 59, 59) - dt.datetime(2025, 11, 30, 4, 47, 30)

    def moved(m: re.Match) -> str:
        t = dt.datetime.strptime(f"2025-{m[1]}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC) + shift
        return t.astimezone(BERLIN).strftime("%m-%d %H:%M:%S")

    dst = re.sub(r"(?<=INFO )(\d\d-\d\d \d\d:\d\d:\d\d)", moved, text)
    steps = [line for line in dst.splitlines() if "Iteration(" in line]
    assert any("INFO 10-26 02:59:59" in x for x in steps) and any("INFO 10-26 02:00:00" in x for x in steps)
    res, con = _ingest(tmp_path, "dst.log", dst, written)
    ref, con_utc = _ingest(tmp_path, "utc.log", text, written, tz="UTC")
    assert (res.accepted, res.rejected) == (ref.accepted, 0) == (532, 0)
    want = [
        t + shift.total_seconds() for (t,) in con_utc.execute("select t_end from iterations order by iter").fetchall()
    ]
    got = [t for (t,) in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(
    "start, back_s, repeat_at",
    [
        # an ordinary day: no hour repeats, a line 20 s back is a log spliced or repeated
        (dt.datetime(2025, 10, 20, 10, 0, 0, tzinfo=UTC), 20, 20),
        # in the repeated hour, before the change: 5 s back is no fall-back (that goes an hour back)
        (CHANGE - dt.timedelta(minutes=10), 5, 20),
        # after the change (line 16): the line is behind on either reading, by 30 s on the later one
        (CHANGE - dt.timedelta(seconds=30), 30, 30),
    ],
)
def test_a_log_going_back_outside_a_fall_back_is_still_rejected(tmp_path, start, back_s, repeat_at):
    times = [start + dt.timedelta(seconds=2 * i) for i in range(40)]
    times[repeat_at] = times[repeat_at - 1] - dt.timedelta(seconds=back_s)
    text = "\n".join(_sglang_line(t, k) for k, t in enumerate(times)) + "\n"
    res, con = _ingest(tmp_path, "back.log", text)
    assert (res.accepted, res.rejected) == (39, 1)
    (line, reason) = con.execute("select line_no, reason from rejects").fetchone()
    assert line == repeat_at + 1 and f"stamped {back_s}" in reason and "repeated or spliced" in reason
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == [t.timestamp() for k, t in enumerate(times) if k != repeat_at]


def test_a_vllm_step_going_back_outside_a_fall_back_is_still_rejected(tmp_path):
    """vLLM: a step whose line is an hour before the one before it, on an ordinary day."""
    written = dt.datetime(2025, 12, 1, tzinfo=UTC).timestamp()
    lines = (FIX / "server.log").read_text().splitlines()
    k = [i for i, line in enumerate(lines) if "Iteration(" in line][300]
    lines[k] = re.sub(r"INFO 11-30 04:(\d\d)", lambda m: f"INFO 11-30 03:{m[1]}", lines[k])
    res, con = _ingest(tmp_path, "back.log", "\n".join(lines) + "\n", written)
    assert (res.accepted, res.rejected) == (531, 1)
    (line, reason) = con.execute("select line_no, reason from rejects").fetchone()
    assert line == k + 1 and "longer than the log's timestamps allow" in reason
    assert re.search(r"this step's line is -3\d{3}(\.\d+)? s after the previous step's", reason)


# TensorRT-LLM's IterationStats ``timestamp`` is the writer's local time without a zone
# (``%m-%d-%Y %H:%M:%S.%f``). DuckDB's timezone() read every stamp of the repeated hour as its
# later instant: the steps before the change came an hour late, and the log ran an hour back.
TRT_CHANGE = dt.datetime(2026, 10, 25, 1, 0, 0, tzinfo=UTC)  # Berlin: 03:00 CEST becomes 02:00 CET
TRT_FIX = Path(__file__).resolve().parents[2] / "fixtures" / "trtllm"


def _trtllm_records(times: list[dt.datetime], zone: ZoneInfo = BERLIN) -> list[dict]:
    """The fixture's second step, once per time, stamped as the writer's wall clock in ``zone``."""
    import ast

    step = ast.literal_eval((TRT_FIX / "iteration_log.txt").read_text().splitlines()[1])
    return [
        dict(step, iter=k, timestamp=t.astimezone(zone).strftime("%m-%d-%Y %H:%M:%S.%f")) for k, t in enumerate(times)
    ]


@pytest.mark.parametrize("shape", ["iteration_log", "metrics_array"])
@pytest.mark.parametrize("batch_bytes", [None, 1500])  # 1500: about a record a batch, the change between two
def test_trtllm_stats_through_the_fall_back_keep_their_instants(tmp_path, monkeypatch, shape, batch_bytes):
    import json

    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    # 20 steps in the first pass of 02:59 (CEST), 20 in the second (CET), 2.25 s apart
    times = [TRT_CHANGE + dt.timedelta(seconds=2.25 * i - 45) for i in range(40)]
    recs = _trtllm_records(times)
    stamps = [r["timestamp"] for r in recs]
    assert "10-25-2026 02:59:57.750000" in stamps and "10-25-2026 02:00:00.000000" in stamps  # the clock went back
    if shape == "iteration_log":  # trtllm-bench --iteration_log: one dict repr a line
        res, con = _ingest(tmp_path, "iter.log", "\n".join(repr(r) for r in recs) + "\n")
    else:  # trtllm-serve's GET /metrics
        res, con = _ingest(tmp_path, "metrics.json", json.dumps(recs))
    assert (res.format, res.accepted, res.rejected) == ("trtllm-iterlog", 40, 0)
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == pytest.approx([t.timestamp() for t in times], abs=1e-6)
    assert con.execute("select meta->>'$.timestamps_time_zone' from runs").fetchone()[0] == "Europe/Berlin"


def test_trtllm_stats_an_hour_back_on_an_ordinary_day_are_rejected_not_moved(tmp_path):
    """No hour repeats on 20 Oct: a step an hour behind the one before is not moved to a later
    reading; it is a spliced log, rejected as vLLM's and SGLang's lines are (it was accepted
    as written, running the timeline back an hour). The others keep their one reading."""
    times = [dt.datetime(2026, 10, 20, 10, 0, 0, tzinfo=UTC) + dt.timedelta(seconds=2 * i) for i in range(10)]
    times[5] -= dt.timedelta(hours=1)
    res, con = _ingest(tmp_path, "iter.log", "\n".join(repr(r) for r in _trtllm_records(times)) + "\n")
    assert (res.accepted, res.rejected) == (9, 1)
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == 6 and reason.startswith("IterationStats record stamped 3598.0 s before an earlier record")
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == [t.timestamp() for k, t in enumerate(times) if k != 5]


def test_trtllm_stamp_in_the_hour_a_spring_forward_skips_is_rejected_naming_it(tmp_path):
    """Berlin, 29 Mar 2026: 02:00 CET becomes 03:00 CEST, so 02:30 is no time there. DuckDB read
    it as 03:30 CEST without a word; it is rejected (as vLLM's and SGLang's lines are), saying why."""
    times = [dt.datetime(2026, 3, 29, 0, 59, 58, tzinfo=UTC) + dt.timedelta(seconds=i) for i in range(4)]
    recs = _trtllm_records(times)
    recs[2]["timestamp"] = "03-29-2026 02:30:00.000000"
    res, con = _ingest(tmp_path, "iter.log", "\n".join(repr(r) for r in recs) + "\n")
    assert (res.accepted, res.rejected) == (3, 1)
    assert con.execute("select line_no, reason from rejects").fetchall() == [
        (
            3,
            "timestamp 03-29-2026 02:30:00.000000 is no time in Europe/Berlin (a DST change skips it): "
            "is --tz the zone the log was written in?",
        )
    ]
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == [t.timestamp() for k, t in enumerate(times) if k != 2]


@pytest.mark.parametrize("at", ["first pass", "second pass"])
@pytest.mark.parametrize("n_ahead", [1, 3])
@pytest.mark.parametrize("batch_bytes", [None, 1500])
def test_trtllm_records_stamped_ahead_in_the_repeated_hour_move_no_other_record(
    tmp_path, monkeypatch, at, n_ahead, batch_bytes
):
    """Records stamped 40 min ahead inside the hour a fall-back repeats: the later reading of the
    next good records was chosen against them (they were the latest stamps so far), so those came an
    hour late, and the records after the real change were then rejected as behind them (review:
    18 of 40 accepted). The records ahead are the outliers, judged as on any other day."""
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    # 20 steps from 02:10 CEST (first pass), 20 from 02:05 CET (second pass), 2.25 s apart
    times = [TRT_CHANGE - dt.timedelta(minutes=50) + dt.timedelta(seconds=2.25 * i) for i in range(20)]
    times += [TRT_CHANGE + dt.timedelta(minutes=5) + dt.timedelta(seconds=2.25 * i) for i in range(20)]
    recs = _trtllm_records(times)
    first = 5 if at == "first pass" else 25
    for r in recs[first : first + n_ahead]:  # the same wall-clock hour, 40 min later
        r["timestamp"] = r["timestamp"].replace(" 02:10:", " 02:50:").replace(" 02:05:", " 02:45:")
    assert all(" 02:4" in r["timestamp"] or " 02:5" in r["timestamp"] for r in recs[first : first + n_ahead])
    res, con = _ingest(tmp_path, "iter.log", "\n".join(repr(r) for r in recs) + "\n")
    assert (res.accepted, res.rejected) == (40 - n_ahead, n_ahead)
    rejected = con.execute("select line_no, reason from rejects order by line_no").fetchall()
    assert [line for line, _ in rejected] == list(range(first + 1, first + 1 + n_ahead))
    assert all(reason.startswith("IterationStats record stamped ") for _, reason in rejected)
    assert all("after a record that follows it" in reason for _, reason in rejected)
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    want = [t.timestamp() for k, t in enumerate(times) if not first <= k < first + n_ahead]
    assert got == pytest.approx(want, abs=1e-6)


def _trtllm_ingest(tmp_path, name: str, stamps: list[str], bad: dict[int, dict] | None = None):
    """The fixture's second step once per wall-clock stamp (Berlin), as an iteration log; ``bad``:
    fields to override by record."""
    recs = [dict(r, timestamp=s) for r, s in zip(_trtllm_records([TRT_CHANGE] * len(stamps)), stamps)]
    for k, fields in (bad or {}).items():
        recs[k].update(fields)
    res, con = _ingest(tmp_path, name, "\n".join(repr(r) for r in recs) + "\n")
    got = dict(con.execute("select iter, t_end from iterations").fetchall())
    lines = [r[0] for r in con.execute("select line_no from rejects order by line_no").fetchall()]
    return res, got, lines


def _wall(t: dt.datetime) -> str:
    return t.astimezone(BERLIN).strftime("%m-%d-%Y %H:%M:%S.%f")


@pytest.mark.parametrize("batch_bytes", [None, 1500])
def test_trtllm_sparse_records_of_the_first_pass_are_steps_not_outliers(tmp_path, monkeypatch, batch_bytes):
    """Review: an idle server writes two records at 02:45 CEST, then traffic again from 02:30 CET.
    The two are 'ahead' of the record after them on its earlier reading, as an outlier is; taken for
    outliers, they were rejected and the 30 records after the change came an hour early. Records ahead
    are outliers only between two steps close together (the outlier case: seconds apart)."""
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    at = [TRT_CHANGE + dt.timedelta(minutes=m, seconds=s) for m, s in [(-60, 10 * i) for i in range(30)]]
    at += [TRT_CHANGE - dt.timedelta(minutes=15), TRT_CHANGE - dt.timedelta(minutes=15, seconds=-1)]
    at += [TRT_CHANGE + dt.timedelta(minutes=30, seconds=10 * i) for i in range(30)]
    res, got, rejected = _trtllm_ingest(tmp_path, "sparse.log", [_wall(t) for t in at])
    assert (res.accepted, res.rejected, rejected) == (62, 0, [])
    assert [got[k] for k in range(62)] == pytest.approx([t.timestamp() for t in at], abs=1e-6)


@pytest.mark.parametrize("batch_bytes", [None, 1500])
@pytest.mark.parametrize("why", ["stamped behind", "stamped behind, bad field"])
def test_trtllm_one_record_stamped_behind_in_the_first_pass_moves_no_other(tmp_path, monkeypatch, batch_bytes, why):
    """Review: one good record 40 min behind inside the first pass of the repeated hour took the
    later reading (20 min ahead), so the records after it came an hour late and the 20 after the
    change were rejected as behind them. A clock set back leaves the next record behind too; one
    stamp behind does not: it keeps its reading and is the one rejected, as on any other day. A
    record rejected for a field is no step before the others either, at any reader batch size."""
    if batch_bytes:
        monkeypatch.setattr(reader, "BATCH_BYTES", batch_bytes)
    at = [TRT_CHANGE - dt.timedelta(minutes=10) + dt.timedelta(seconds=2 * i) for i in range(20)]
    at += [TRT_CHANGE + dt.timedelta(minutes=5) + dt.timedelta(seconds=2 * i) for i in range(20)]
    stamps = [_wall(t) for t in at]
    stamps[5] = stamps[5].replace(" 02:50:", " 02:10:")
    bad = {5: {"iterLatencyMS": "abc"}} if "bad" in why else None
    res, got, rejected = _trtllm_ingest(tmp_path, "behind.log", stamps, bad)
    assert (res.accepted, res.rejected, rejected) == (39, 1, [6])
    assert [got[k] for k in range(40) if k != 5] == pytest.approx([t.timestamp() for k, t in enumerate(at) if k != 5])


@pytest.mark.parametrize(
    "offsets_s",
    [
        [-5400, -3600, -1800, 0, 1800, 3600, 5400],  # a line every 30 min: the wall times repeat exactly
        [-1500, -1200, 600, 2700, 2760, 3700],  # an idle server at night
        [-600, 600, 3300],
    ],
)
def test_a_sparse_log_through_the_fall_back_keeps_every_line(tmp_path, offsets_s):
    """Review: a line stamped behind keeps its earlier reading when the next line is in order
    with the lines before it. In a log written minutes apart through the change, the next line's
    earlier reading is in order too: the first line after the change was rejected and the lines
    after it came an hour early. Only among lines seconds apart is a line behind taken for one."""
    times = [CHANGE + dt.timedelta(seconds=s) for s in offsets_s]
    res, con = _ingest(tmp_path, "sparse.log", "\n".join(_sglang_line(t, k) for k, t in enumerate(times)) + "\n")
    assert (res.accepted, res.rejected) == (len(times), 0)
    got = [r[0] for r in con.execute("select t_end from iterations order by t_end").fetchall()]
    assert got == [t.timestamp() for t in times]


def test_one_sglang_line_stamped_behind_in_the_first_pass_is_the_one_rejected(tmp_path):
    """Lines 10 s apart, one stamped 40 min behind inside the first pass: it took the later reading
    (20 min ahead) and every line after it came an hour late."""
    times = [CHANGE + dt.timedelta(seconds=s) for s in [-600, -590, -3000, -580, -570, -560]]
    res, con = _ingest(tmp_path, "behind.log", "\n".join(_sglang_line(t, k) for k, t in enumerate(times)) + "\n")
    assert (res.accepted, res.rejected) == (5, 1)
    assert [r[0] for r in con.execute("select line_no from rejects").fetchall()] == [3]
    got = [r[0] for r in con.execute("select t_end from iterations order by t_end").fetchall()]
    assert got == [t.timestamp() for k, t in enumerate(times) if k != 2]
