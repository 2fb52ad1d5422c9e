"""Log stamps that name their own zone (Docker's ``Z``, ``+01:00``) are read as written.

Before, the zone mark was dropped and the time read as wall time in --tz or this machine's
zone: under TZ=Asia/Tokyo a Docker log's first step came 9 h early, and a log with offsets
+00:00 and +01:00 ran an hour longer than it did.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from pipeline import store

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
N_LINES = 160  # the start-up lines and the first ~80 steps: enough, and quick

_UTC = dt.timezone.utc
_ZONES = [
    dt.timezone(dt.timedelta(hours=1)),
    dt.timezone(-dt.timedelta(hours=5, minutes=30)),
    dt.timezone(dt.timedelta(hours=9)),
]


def _docker(t: dt.datetime, k: int) -> str:
    """Docker's --timestamps: UTC, nanosecond digits, a Z."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def _mixed(t: dt.datetime, k: int) -> str:
    """The same instant with another offset on each line, as isoformat() and %z write them."""
    if k % 4 == 0:
        return t.isoformat(timespec="microseconds")  # +00:00
    local = t.astimezone(_ZONES[k % 3])
    return local.isoformat(timespec="microseconds") if k % 2 else local.strftime("%Y-%m-%dT%H:%M:%S.%f%z")


def _hours_only(t: dt.datetime, k: int) -> str:
    """Offsets of whole hours as ``+01`` (ISO 8601's ``±hh``; PostgreSQL's and DuckDB's text of a
    timestamptz), with a T or a space before the time."""
    local = t.astimezone(_WHOLE_HOURS[k % 3])
    return local.strftime("%Y-%m-%dT%H:%M:%S.%f" if k % 2 else "%Y-%m-%d %H:%M:%S.%f") + local.strftime("%z")[:3]


def _spaced(t: dt.datetime, k: int) -> str:
    """The offset after a space (``%z`` in a logging datefmt ``%Y-%m-%d %H:%M:%S %z``, Go's
    time.String()), as ``+0100``, ``+01:00`` or ``+01``."""
    local = t.astimezone(_ZONES[k % 3])
    z = local.strftime("%z")
    mark = (z, f"{z[:3]}:{z[3:]}", z[:3])[k % 3] if z[3:] == "00" else z
    return local.strftime("%Y-%m-%d %H:%M:%S.%f") + " " + mark


_WHOLE_HOURS = [dt.timezone(dt.timedelta(hours=1)), dt.timezone(-dt.timedelta(hours=5)), _UTC]


def _restamped(tmp_path: Path, name: str, stamp) -> Path:
    """The head of server_epoch.log with each epoch stamp written by ``stamp``, same instants
    (continuation lines of a multi-line message have no stamp and stay as they are)."""
    out = []
    for k, line in enumerate((FIX / "server_epoch.log").read_text().splitlines()[:N_LINES]):
        m = re.match(r"(\d{10}\.\d{6}) (.*)$", line)
        out.append(f"{stamp(dt.datetime.fromtimestamp(float(m[1]), _UTC), k)} {m[2]}" if m else line)
    path = tmp_path / name
    path.write_text("\n".join(out) + "\n")
    return path


def _steps(tmp_path: Path, path: Path, tz: str | None) -> tuple[list[tuple], dict]:
    con = store.connect(tmp_path / f"{path.stem}-{(tz or '').replace('/', '_')}.duckdb")
    (res,) = load(con, path, **({"tz": tz} if tz else {}))
    assert (res.format, res.rejected) == ("vllm-log", 0)
    rows = con.execute("select iter, t_start, t_end from iterations order by iter").fetchall()
    meta = json.loads(con.execute("select meta from runs").fetchone()[0])
    return rows, meta


@pytest.mark.parametrize("machine_tz, tz", [("Asia/Tokyo", None), ("Asia/Tokyo", "America/New_York"), ("UTC", None)])
@pytest.mark.parametrize(
    "name, stamp, offsets",
    [
        ("docker_z", _docker, ["+00:00"]),
        ("mixed", _mixed, None),
        # read as wall time in --tz (or this machine's zone) before: hours off, with no word said
        ("hours_only", _hours_only, ["+00:00", "+01:00", "-05:00"]),
        ("spaced", _spaced, ["+01:00", "+09:00", "-05:30"]),
    ],
)
@pytest.mark.long
def test_stamps_with_their_own_zone_give_the_epoch_log_times(
    tmp_path, monkeypatch, machine_tz, tz, name, stamp, offsets
):
    monkeypatch.setenv("TZ", machine_tz)
    epoch = tmp_path / "epoch.log"
    epoch.write_text("\n".join((FIX / "server_epoch.log").read_text().splitlines()[:N_LINES]) + "\n")
    want, _ = _steps(tmp_path, epoch, None)
    assert len(want) > 50 and want[0][2] == pytest.approx(1796014047.991155, abs=1e-6)

    got, meta = _steps(tmp_path, _restamped(tmp_path, f"{name}.log", stamp), tz)
    assert [r[0] for r in got] == [r[0] for r in want]
    for (_, s_got, e_got), (_, s_want, e_want) in zip(got, want, strict=True):
        assert (s_got, e_got) == (pytest.approx(s_want, abs=1e-6), pytest.approx(e_want, abs=1e-6))
    # the stamps' own zones are the record, not --tz or this machine's zone (which did not apply)
    assert "timestamps_time_zone" not in meta
    assert meta["timestamps_utc_offsets"] == (offsets or ["+00:00", "+01:00", "+09:00", "-05:30"])


def test_zone_less_stamps_still_read_in_tz_and_say_so(tmp_path, monkeypatch):
    """A stamp without a zone stays wall time in --tz (else this machine's zone), named in the meta."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    path = _restamped(tmp_path, "plain.log", lambda t, k: t.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3])
    epoch = tmp_path / "epoch.log"
    epoch.write_text("\n".join((FIX / "server_epoch.log").read_text().splitlines()[:N_LINES]) + "\n")
    want, _ = _steps(tmp_path, epoch, None)
    got, meta = _steps(tmp_path, path, None)
    assert got[0][2] == pytest.approx(want[0][2] - 9 * 3600, abs=2e-3)  # UTC wall time read as Tokyo's
    assert meta["timestamps_time_zone"] == "Asia/Tokyo (this machine's zone; pass --tz to change)"
    assert "timestamps_utc_offsets" not in meta
    got, meta = _steps(tmp_path, path, "UTC")
    assert got[0][2] == pytest.approx(want[0][2], abs=2e-3)
    assert meta["timestamps_time_zone"] == "UTC"


def _sglang_log(tmp_path: Path, stamps: list[str]) -> tuple[object, object]:
    """An SGLang decode line per stamp (``[stamp DP0 TP0]``, as a datefmt with ``%z`` writes it), ingested under --tz Asia/Tokyo."""
    text = "".join(
        f"[{s} DP0 TP0] Decode batch. #running-req: 2, #token: {500 + 40 * k}, token usage: 0.03, "
        "cuda graph: True, gen throughput (token/s): 70.00, #queue-req: 0,\n"
        for k, s in enumerate(stamps)
    )
    path = tmp_path / "sgl.log"
    path.write_text(text)
    con = store.connect(tmp_path / "sgl.duckdb")
    (res,) = load(con, path, tz="Asia/Tokyo")
    assert res.format == "sglang-log"
    return res, con


def test_sglang_offsets_after_a_space_or_of_hours_only_are_read_as_written(tmp_path):
    """``2026-03-01 10:00:00 +0100`` and ``+01`` name their offset: read as written, not as wall time in --tz."""
    t0 = dt.datetime(2026, 3, 1, 9, 0, 0, tzinfo=_UTC)
    times = [t0 + dt.timedelta(seconds=3 * k) for k in range(6)]
    zones = [_ZONES[0], _ZONES[1], _WHOLE_HOURS[1], _ZONES[2], _WHOLE_HOURS[0], _UTC]
    local = [t.astimezone(z) for t, z in zip(times, zones, strict=True)]
    stamps = [
        local[0].strftime("%Y-%m-%d %H:%M:%S %z"),  # +0100
        local[1].isoformat(sep=" ").replace("-05:30", " -05:30"),  # a space, then +hh:mm
        local[2].strftime("%Y-%m-%d %H:%M:%S") + "-05",  # hours only, as a timestamptz prints
        local[3].strftime("%Y-%m-%dT%H:%M:%S") + " +09",  # hours only, after a space
        local[4].strftime("%Y-%m-%d %H:%M:%S") + "+01",
        local[5].strftime("%Y-%m-%d %H:%M:%S") + " +00",
    ]
    assert stamps[:4] == [
        "2026-03-01 10:00:00 +0100",
        "2026-03-01 03:30:03 -05:30",
        "2026-03-01 04:00:06-05",
        "2026-03-01T18:00:09 +09",
    ]
    res, con = _sglang_log(tmp_path, stamps)
    assert (res.accepted, res.rejected) == (6, 0)
    got = [r[0] for r in con.execute("select t_end from iterations order by iter").fetchall()]
    assert got == [t.timestamp() for t in times]
    meta = json.loads(con.execute("select meta from runs").fetchone()[0])
    assert "timestamps_time_zone" not in meta  # --tz applied to none of them
    assert meta["timestamps_utc_offsets"] == ["+00:00", "+01:00", "+09:00", "-05:00", "-05:30"]


BAD_OFFSETS = ["+1:00", "+25:00", "+01:0", " +01:75", "-01000"]


def test_a_malformed_utc_offset_rejects_its_line_naming_it(tmp_path):
    """A sign and digits after the time that make no offset were dropped and the time read as wall
    time in --tz, hours off without a word; the line is rejected, naming what stood there."""
    path = _restamped(tmp_path, "bad.log", lambda t, k: t.isoformat(timespec="microseconds"))
    lines = path.read_text().splitlines()
    steps = [k for k, line in enumerate(lines) if "Iteration(" in line]
    broken = steps[10 : 10 + 10 * len(BAD_OFFSETS) : 10]
    for k, bad in zip(broken, BAD_OFFSETS, strict=True):
        assert "+00:00 " in lines[k]
        lines[k] = lines[k].replace("+00:00 ", bad + " ", 1)
    path.write_text("\n".join(lines) + "\n")
    con = store.connect(tmp_path / "bad.duckdb")
    (res,) = load(con, path, tz="UTC")
    assert (res.format, res.rejected) == ("vllm-log", len(BAD_OFFSETS))
    rejects = con.execute("select line_no, reason from rejects order by line_no").fetchall()
    assert rejects == [
        (
            k + 1,
            f"vLLM Iteration line with an unreadable timestamp: '{bad.strip()}' after the time is no UTC offset "
            "(+hh, +hhmm or +hh:mm, or - for west; hours 00-23, minutes 00-59), so the time is unknown",
        )
        for k, bad in zip(broken, BAD_OFFSETS, strict=True)
    ]
    # the other steps keep the instants of the epoch log
    epoch = tmp_path / "epoch.log"
    epoch.write_text("\n".join((FIX / "server_epoch.log").read_text().splitlines()[:N_LINES]) + "\n")
    want, _ = _steps(tmp_path, epoch, None)
    got = con.execute("select iter, t_end from iterations order by iter").fetchall()
    skipped = {int(re.search(r"Iteration\((\d+)\)", lines[k])[1]) for k in broken}
    assert got == [(i, pytest.approx(e, abs=1e-6)) for i, _, e in want if i not in skipped]

    res, con = _sglang_log(tmp_path, ["2026-03-01 10:00:00 +0100", "2026-03-01 10:00:03+1:00"])
    assert (res.accepted, res.rejected) == (1, 1)
    assert con.execute("select line_no, reason from rejects").fetchall() == [
        (
            2,
            "SGLang Decode batch line with an unreadable timestamp: '+1:00' after the time is no UTC offset "
            "(+hh, +hhmm or +hh:mm, or - for west; hours 00-23, minutes 00-59), so the time is unknown",
        )
    ]
