"""Headless Chromium for the tests that draw our pages (tests/report, tests/nightly).

A preflight renders a trivial page of our own first, once per session (the
``chromium`` fixture of tests/conftest.py).  Browser tests are skipped, with the
reason, only when no browser is installed or that preflight fails: then the browser
itself cannot run here.  Once it has shown that it works, whatever goes wrong on one
of our pages (Chromium crashing or exiting non-zero, a hang, an empty or error DOM)
is a test FAILURE, never a skip: a page that kills the renderer is exactly what these
tests exist to catch.  ``TRACELAT_REQUIRE_BROWSER=1`` (a CI machine that installed
Chromium) turns a missing or broken browser into a failure as well.

The browser runs offline: every request goes to a dead proxy and DNS is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",
    "--no-first-run",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # no network: every request goes to a dead proxy, DNS is refused too
    "--proxy-server=127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=30000",
    "--window-size=1280,4000",
)
TIMEOUT_S = 180
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")
# what Chromium shows instead of a page it could not open (net error pages)
ERROR_PAGE = re.compile(r'"errorCode":"(ERR_[A-Z_]+)"')

# The preflight page: a script must run (it rewrites the paragraph) and its console
# message must reach stderr, or the console checks of the real tests would pass vacuously.
PREFLIGHT_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>tracelat preflight</title></head>
<body><p id="probe">static</p>
<script>document.getElementById("probe").textContent = "ran " + (6 * 7); console.log("tracelat-preflight");</script>
</body></html>
"""
PREFLIGHT_DOM = '<p id="probe">ran 42</p>'
PREFLIGHT_CONSOLE = "tracelat-preflight"


class BrowserUnavailable(Exception):
    """The browser cannot run here (not a fault of any page of ours)."""


@dataclass(frozen=True)
class Rendered:
    dom: str  # the DOM after scripts ran
    console: list[str]  # console messages, in order
    stderr: str


def _tail(text: str, n: int = 600) -> str:
    # the browser's log may hold anything: no control characters in a test report
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", text[-n:])


class Chromium:
    """One headless Chromium binary; every call gets a fresh profile folder under ``workdir``."""

    def __init__(self, binary: str, workdir: Path, timeout_s: float = TIMEOUT_S):
        self.binary, self.workdir, self.timeout_s = binary, Path(workdir), timeout_s

    def run(self, *args: str) -> subprocess.CompletedProcess:
        """The browser with ``args``; raises subprocess.TimeoutExpired or OSError as they come."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        profile = tempfile.mkdtemp(prefix="profile-", dir=self.workdir)
        try:
            return subprocess.run(
                [self.binary, *FLAGS, f"--user-data-dir={profile}", *args],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
            )
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    def dump_dom(self, page: Path) -> Rendered:
        """Our page drawn: its DOM after scripts ran, and its console messages.

        The browser passed its preflight, so any failure here is the page's: a test failure.
        """
        page = Path(page)
        if not page.is_file():
            pytest.fail(f"page {page} does not exist")
        try:
            r = self.run("--dump-dom", page.resolve().as_uri())
        except subprocess.TimeoutExpired:
            pytest.fail(f"chromium did not finish {page.name} within {self.timeout_s:.0f} s")
        if r.returncode != 0 or not r.stdout.strip():
            pytest.fail(
                f"chromium failed on {page.name} (exit {r.returncode}, {len(r.stdout)} bytes of DOM) "
                f"after its preflight passed: {_tail(r.stderr)}"
            )
        error = ERROR_PAGE.search(r.stdout)
        if error:
            pytest.fail(f"chromium showed its error page for {page.name}: {error.group(1)}")
        return Rendered(r.stdout, CONSOLE.findall(r.stderr), r.stderr)

    def screenshot(self, page: Path, out: Path) -> Path:
        """A PNG of our page; failing to write one is a test failure, as for :meth:`dump_dom`."""
        try:
            r = self.run(f"--screenshot={out}", Path(page).resolve().as_uri())
        except subprocess.TimeoutExpired:
            pytest.fail(f"chromium did not take a screenshot of {Path(page).name} within {self.timeout_s:.0f} s")
        if r.returncode != 0 or not out.is_file():
            pytest.fail(
                f"chromium could not take a screenshot of {Path(page).name} (exit {r.returncode}): {_tail(r.stderr)}"
            )
        return out


def find_browser() -> str | None:
    """``$TRACELAT_CHROMIUM`` when set, else the first of CANDIDATES on PATH."""
    named = os.environ.get("TRACELAT_CHROMIUM")
    if named:
        return shutil.which(named) or named
    return next((b for b in map(shutil.which, CANDIDATES) if b), None)


def preflight(binary: str, workdir: Path) -> Chromium:
    """A browser that has drawn the trivial page: its script ran and its console was read.

    Raises :class:`BrowserUnavailable` saying why not.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    page = workdir / "preflight.html"
    page.write_text(PREFLIGHT_HTML, encoding="utf-8")
    browser = Chromium(binary, workdir)
    try:
        r = browser.run("--dump-dom", page.as_uri())
    except subprocess.TimeoutExpired:
        raise BrowserUnavailable(f"{binary} did not draw a trivial page within {browser.timeout_s:.0f} s") from None
    except OSError as exc:
        raise BrowserUnavailable(f"{binary} cannot be started: {exc}") from None
    if r.returncode != 0 or PREFLIGHT_DOM not in r.stdout:
        raise BrowserUnavailable(
            f"{binary} cannot draw a trivial page here (exit {r.returncode}, "
            f"{len(r.stdout)} bytes of DOM): {_tail(r.stderr, 300)}"
        )
    console = CONSOLE.findall(r.stderr)
    if not any(PREFLIGHT_CONSOLE in m for m in console):
        raise BrowserUnavailable(
            f"{binary} drew a trivial page but its console messages are not on stderr "
            "(console checks would pass vacuously)"
        )
    return browser


def browser_or_skip(workdir: Path) -> Chromium:
    """The preflighted browser; skips (or with TRACELAT_REQUIRE_BROWSER=1 fails) the test when there is none."""
    binary = find_browser()
    try:
        if binary is None:
            raise BrowserUnavailable(f"headless Chromium is not installed (looked for {', '.join(CANDIDATES)})")
        return preflight(binary, workdir)
    except BrowserUnavailable as exc:
        if os.environ.get("TRACELAT_REQUIRE_BROWSER", "") not in ("", "0"):
            pytest.fail(f"TRACELAT_REQUIRE_BROWSER is set but {exc}")
        pytest.skip(str(exc))
