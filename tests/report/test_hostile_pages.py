"""A run id that tries to close the page's <script> never reaches any HTML page raw."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import SCRIPT_PAYLOAD as PAYLOAD
from .test_spec_schema import assert_valid_vega_lite
from .conftest import SCRIPT_RUN as RUN
from .conftest import script_sweep_page


def assert_no_raw_payload(html: str) -> None:
    assert PAYLOAD not in html
    assert "<script>alert(1)" not in html
    # the page's own scripts only: the bundle, the embed code, the JSON specs
    assert html.count("</script>") == 3, html.count("</script>")


@pytest.mark.long
def test_payload_never_raw_in_any_page(script_store, tmp_path, string_channels):
    from pipeline.compare import compare
    from pipeline.report import write_report
    from pipeline.report.compare_page import write_comparison

    con, _ = script_store
    pages = {
        "report": write_report(con, RUN, tmp_path / "rep"),
        "compare": write_comparison(compare(con, "base", con, RUN), con, con, tmp_path / "cmp"),
        "sweep": script_sweep_page(con, tmp_path / "sweep.html"),
    }
    for name, path in pages.items():
        html = path.read_text(encoding="utf-8")
        assert_no_raw_payload(html)
        assert "evil&lt;/script&gt;" in html or "evil\\u003c/script\\u003e" in html, name  # the id is there, escaped
        assert_valid_vega_lite(name, html)
    assert not string_channels, f"{len(string_channels)} chart channels given as strings (a tenth of a report)"


def test_csp_allows_only_the_pages_own_scripts(script_store, tmp_path):
    import base64
    import hashlib
    import re

    con, _ = script_store
    html = script_sweep_page(con, tmp_path / "sweep.html").read_text(encoding="utf-8")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html).group(1)
    assert "unsafe-eval" not in policy and "default-src 'none'" in policy
    script_src = re.search(r"script-src ([^;]*)", policy).group(1)
    assert "unsafe-inline" not in script_src
    # every executable inline script is allowed by its hash, and nothing else is
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in scripts}
    assert len(scripts) == 2 and set(script_src.split()) == hashes


@pytest.mark.long
def test_payload_never_raw_in_the_fleet_page(script_store, tmp_path):
    """The fleet page and the run reports it writes, from a lake holding the hostile run."""
    from pipeline.fleet import fleet
    from pipeline.lake import export_runs
    from pipeline.report.fleet_page import write_fleet_page

    con, _ = script_store
    export_runs(con, [RUN, "base"], tmp_path / "lake")
    result = fleet(tmp_path / "lake", workers=1, out=tmp_path / "fleet")
    html = write_fleet_page(result, tmp_path / "fleet").read_text(encoding="utf-8")
    assert_no_raw_payload(html)
    assert "evil&lt;/script&gt;" in html and "evil\\u003c/script\\u003e" in html  # in the table and the chart data
    report = next(r["report"] for r in result["runs"] if r["run_id"] == RUN)
    assert_no_raw_payload((Path(report) / "index.html").read_text(encoding="utf-8"))
