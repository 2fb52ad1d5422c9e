"""The report in real headless Chromium, offline: every chart drew, nothing logged to the console.

Needs the Debian ``chromium`` package (``apt-get install -y chromium``); skipped when absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from pipeline.report import write_report

from .conftest import SCRIPT_PAYLOAD, script_sweep_page

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(BROWSER is None, reason="headless Chromium is not installed")]
FLAGS = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # no network: every request goes to a dead proxy, DNS is refused too
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=30000", "--window-size=1280,4000"]


def chromium(*args: str, tmp_path) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    try:
        return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("chromium did not finish within 180 s")


def render(index, tmp_path) -> tuple[str, list[str]]:
    """(DOM after scripts ran, console messages)."""
    r = chromium("--dump-dom", index.as_uri(), tmp_path=tmp_path)
    if r.returncode != 0 and not r.stdout:
        pytest.skip(f"chromium cannot run here: {r.stderr[-500:]}")
    console = re.findall(r":CONSOLE[^\]]*\] (.*)", r.stderr)
    return r.stdout, console


def check_page(index, tmp_path, expected_charts: int) -> None:
    dom, console = render(index, tmp_path)
    status = re.search(r'<p id="render-status"([^>]*)>', dom)
    assert status, "the page's status line is missing from the DOM"
    attrs = dict(re.findall(r'data-(\w+)="(\d+)"', status.group(1)))
    assert attrs == {"done": "1", "ok": str(expected_charts), "failed": "0"}, attrs
    # every chart container holds a drawn SVG with marks
    for cid in re.findall(r'<div class="chart[^"]*" id="(chart-[a-z_]+)"', dom):
        block = dom.split(f'id="{cid}"', 1)[1][:200_000]
        assert "<svg" in block and 'class="mark-' in block, f"{cid} did not draw"
    assert console == [], f"console messages: {console}"
    shot = tmp_path / "screenshot.png"
    chromium(f"--screenshot={shot}", index.as_uri(), tmp_path=tmp_path)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_report_renders_offline_in_chromium(synth_run, tmp_path):
    con, rid = synth_run
    index = write_report(con, rid, tmp_path / "rep")
    check_page(index, tmp_path, expected_charts=7)


def test_hostile_report_renders_without_injection(hostile_run, tmp_path):
    con, rid, _ = hostile_run
    index = write_report(con, rid, tmp_path / "rep")
    dom, console = render(index, tmp_path)
    # had any string escaped its context, an element would have appeared (or alert() run and logged)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "<img" not in body and not re.search(r"<[^>]+\son\w+=", body)
    assert "&lt;b onmouseover=" in body and "&lt;/script&gt;&lt;img src=x" in body  # shown as text
    assert console == []
    assert 'data-failed="0"' in dom and 'data-done="1"' in dom


def test_hostile_sweep_page_renders_without_injection(script_store, tmp_path):
    con, _ = script_store
    index = script_sweep_page(con, tmp_path / "sweep.html")
    check_page(index, tmp_path, expected_charts=1)  # drawn under the CSP, nothing on the console
    dom, console = render(index, tmp_path)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "alert(1)" not in re.sub(r"&lt;script&gt;alert\(1\)", "", body)  # only ever as escaped text
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in body and SCRIPT_PAYLOAD not in body
    assert console == []


def test_hostile_fleet_page_renders_without_injection(hostile_run, tmp_path):
    """The fleet page of a lake holding a run whose id and model try to inject markup: drawn under the
    CSP, the strings shown as text, nothing run."""
    from pipeline.fleet import fleet
    from pipeline.lake import export_runs
    from pipeline.report.fleet_page import write_fleet_page

    con, rid, bad = hostile_run
    export_runs(con, [rid], tmp_path / "lake")
    result = fleet(tmp_path / "lake", workers=1, out=tmp_path / "fleet")
    index = write_fleet_page(result, tmp_path / "fleet")
    check_page(index, tmp_path, expected_charts=1)
    dom, console = render(index, tmp_path)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "<img" not in body and not re.search(r"<[^>]+\son\w+=", body)
    assert "&lt;/script&gt;&lt;img src=x" in body and "&lt;script&gt;alert(" in body  # model and run id as text
    assert console == []
