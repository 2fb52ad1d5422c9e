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
@pytest.mark.parametrize("name, stamp, offsets", [("docker_z", _docker, ["+00:00"]), ("mixed", _mixed, None)])
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
