"""The browser harness (tests/headless.py): a browser that cannot run is a skip with its
reason; a browser that passed its preflight and then fails on one of our pages is a failure.

Stand-in browsers (small scripts) play each case, so these run without Chromium; the last
test uses the real one, when it passes its preflight, to show that a page's script error
reaches the console list the browser tests assert empty.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from .headless import PREFLIGHT_CONSOLE, PREFLIGHT_DOM, browser_or_skip, preflight

OK_PREFLIGHT = (
    f"print('<html><body>{PREFLIGHT_DOM}</body></html>'); "
    f"print('[1:1:INFO:CONSOLE:1] \"{PREFLIGHT_CONSOLE}\", source: x (1)', file=sys.stderr)"
)


def fake_browser(tmp_path: Path, on_preflight: str, on_page: str = "sys.exit(0)") -> str:
    """An executable that runs ``on_preflight`` for the preflight page, ``on_page`` for any other."""
    exe = tmp_path / "fake-chromium"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"if 'preflight.html' in sys.argv[-1]:\n    {on_preflight}\nelse:\n    {on_page}\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def page(tmp_path: Path) -> Path:
    p = tmp_path / "ours.html"
    p.write_text("<html><body>ours</body></html>")
    return p


def test_no_browser_is_a_skip_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELAT_CHROMIUM", str(tmp_path / "no-such-browser"))
    monkeypatch.delenv("TRACELAT_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot be started"):
        browser_or_skip(tmp_path / "w")


def test_failed_preflight_is_a_skip_with_the_browsers_words(tmp_path, monkeypatch):
    exe = fake_browser(tmp_path, "print('Missing X server or $DISPLAY', file=sys.stderr); sys.exit(1)")
    monkeypatch.setenv("TRACELAT_CHROMIUM", exe)
    monkeypatch.delenv("TRACELAT_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"exit 1.*Missing X server"):
        browser_or_skip(tmp_path / "w")


def test_preflight_without_console_messages_is_a_skip(tmp_path, monkeypatch):
    # the DOM is right but console lines never reach stderr: console checks would prove nothing
    exe = fake_browser(tmp_path, f"print('{PREFLIGHT_DOM}')")
    monkeypatch.setenv("TRACELAT_CHROMIUM", exe)
    monkeypatch.delenv("TRACELAT_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="console"):
        browser_or_skip(tmp_path / "w")


def test_required_browser_that_cannot_run_is_a_failure(tmp_path, monkeypatch):
    exe = fake_browser(tmp_path, "sys.exit(1)")
    monkeypatch.setenv("TRACELAT_CHROMIUM", exe)
    monkeypatch.setenv("TRACELAT_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="TRACELAT_REQUIRE_BROWSER"):
        browser_or_skip(tmp_path / "w")


@pytest.mark.parametrize(
    "on_page, words",
    [
        ("print('Segmentation fault', file=sys.stderr); sys.exit(139)", r"exit 139.*Segmentation fault"),
        ("print('renderer crashed', file=sys.stderr); sys.exit(0)", r"0 bytes of DOM.*renderer crashed"),
        ('print(\'<script>var d = {"errorCode":"ERR_FILE_NOT_FOUND"};</script>\')', "ERR_FILE_NOT_FOUND"),
    ],
)
def test_crash_on_our_page_after_preflight_is_a_failure_not_a_skip(tmp_path, monkeypatch, on_page, words):
    exe = fake_browser(tmp_path, OK_PREFLIGHT, on_page)
    browser = preflight(exe, tmp_path / "w")  # the browser works ...
    with pytest.raises(pytest.fail.Exception, match=words):  # ... so what our page does to it fails the test
        browser.dump_dom(page(tmp_path))


def test_hang_on_our_page_is_a_failure(tmp_path):
    exe = fake_browser(tmp_path, OK_PREFLIGHT, "import time; time.sleep(30)")
    browser = preflight(exe, tmp_path / "w")
    browser.timeout_s = 1
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        browser.dump_dom(page(tmp_path))


def test_screenshot_not_written_is_a_failure(tmp_path):
    exe = fake_browser(tmp_path, OK_PREFLIGHT, "sys.exit(0)")
    browser = preflight(exe, tmp_path / "w")
    with pytest.raises(pytest.fail.Exception, match="screenshot"):
        browser.screenshot(page(tmp_path), tmp_path / "shot.png")


@pytest.mark.browser
@pytest.mark.long
def test_real_browser_reports_a_pages_script_error(chromium, tmp_path):
    p = tmp_path / "broken.html"
    p.write_text(
        "<html><body><p id='x'>a</p><script>document.getElementById('x').textContent = 'b';"
        "null.boom();</script></body></html>"
    )
    out = chromium.dump_dom(p)
    assert '<p id="x">b</p>' in out.dom  # the script ran up to its error
    assert any("boom" in m or "TypeError" in m for m in out.console), out.console
