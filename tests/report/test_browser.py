"""The report in real headless Chromium, offline: every chart drew, nothing logged to the console.

Needs the Debian ``chromium`` package (``apt-get install -y chromium``).  The ``chromium``
fixture (tests/headless.py) skips these tests only when the browser fails its own
preflight on a trivial page; once it works, a crash or error on our pages fails the test.
"""

from __future__ import annotations

import re

import pytest

from pipeline.report import write_report

from .conftest import SCRIPT_PAYLOAD, SCRIPT_RUN, script_sweep_page

pytestmark = pytest.mark.browser


def render(chromium, index) -> tuple[str, list[str]]:
    """(DOM after scripts ran, console messages)."""
    page = chromium.dump_dom(index)
    return page.dom, page.console


def check_page(chromium, index, tmp_path, expected_charts: int) -> None:
    dom, console = render(chromium, index)
    status = re.search(r'<p id="render-status"([^>]*)>', dom)
    assert status, "the page's status line is missing from the DOM"
    attrs = dict(re.findall(r'data-(\w+)="(\d+)"', status.group(1)))
    assert attrs == {"done": "1", "ok": str(expected_charts), "failed": "0"}, attrs
    # every chart container holds a drawn SVG with marks
    for cid in re.findall(r'<div class="chart[^"]*" id="(chart-[a-z_]+)"', dom):
        block = dom.split(f'id="{cid}"', 1)[1][:200_000]
        assert "<svg" in block and 'class="mark-' in block, f"{cid} did not draw"
    assert console == [], f"console messages: {console}"
    shot = chromium.screenshot(index, tmp_path / "screenshot.png")
    assert shot.stat().st_size > 10_000


@pytest.mark.long
def test_report_renders_offline_in_chromium(chromium, synth_run, tmp_path):
    con, rid = synth_run
    index = write_report(con, rid, tmp_path / "rep")
    check_page(chromium, index, tmp_path, expected_charts=7)


@pytest.mark.long
def test_hostile_report_renders_without_injection(chromium, hostile_run, tmp_path):
    con, rid, _ = hostile_run
    index = write_report(con, rid, tmp_path / "rep")
    dom, console = render(chromium, index)
    # had any string escaped its context, an element would have appeared (or alert() run and logged)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "<img" not in body and not re.search(r"<[^>]+\son\w+=", body)
    assert "&lt;b onmouseover=" in body and "&lt;/script&gt;&lt;img src=x" in body  # shown as text
    assert console == []
    assert 'data-failed="0"' in dom and 'data-done="1"' in dom


def test_hostile_sweep_page_renders_without_injection(chromium, script_store, tmp_path):
    con, _ = script_store
    index = script_sweep_page(con, tmp_path / "sweep.html")
    check_page(chromium, index, tmp_path, expected_charts=1)  # drawn under the CSP, nothing on the console
    dom, console = render(chromium, index)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "alert(1)" not in re.sub(r"&lt;script&gt;alert\(1\)", "", body)  # only ever as escaped text
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in body and SCRIPT_PAYLOAD not in body
    assert console == []


@pytest.mark.long
def test_hostile_compare_page_renders_without_injection(chromium, script_store, tmp_path):
    from pipeline.compare import compare
    from pipeline.report.compare_page import write_comparison

    con, _ = script_store
    index = write_comparison(compare(con, "base", con, SCRIPT_RUN), con, con, tmp_path / "cmp")
    dom, console = render(chromium, index)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "<img" not in body and not re.search(r"<[^>]+\son\w+=", body)
    assert "alert(1)" not in re.sub(r"&lt;script&gt;alert\(1\)", "", body)  # only ever as escaped text
    assert "evil&lt;/script&gt;" in body  # the run id is shown, as text
    assert console == [], f"console messages: {console}"
    assert 'data-failed="0"' in dom and 'data-done="1"' in dom


def test_hostile_fleet_page_renders_without_injection(chromium, hostile_run, tmp_path):
    """The fleet page of a lake holding a run whose id and model try to inject markup: drawn under the
    CSP, the strings shown as text, nothing run."""
    from pipeline.fleet import fleet
    from pipeline.lake import export_runs
    from pipeline.report.fleet_page import write_fleet_page

    con, rid, bad = hostile_run
    export_runs(con, [rid], tmp_path / "lake")
    result = fleet(tmp_path / "lake", workers=1, out=tmp_path / "fleet")
    index = write_fleet_page(result, tmp_path / "fleet")
    check_page(chromium, index, tmp_path, expected_charts=1)
    dom, console = render(chromium, index)
    body = re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)
    assert "<img" not in body and not re.search(r"<[^>]+\son\w+=", body)
    assert "&lt;/script&gt;&lt;img src=x" in body and "&lt;script&gt;alert(" in body  # model and run id as text
    assert console == []
