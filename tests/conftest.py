"""Shared fixtures: a fresh store per test, and the shared real-data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REALDATA = Path(os.environ.get("TRACELAT_REALDATA", REPO.parent / "shared" / "realdata"))


def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for ``-n auto``: one per core, at most 4 (a slow test's store and trace take
    a GiB or two each); PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that each case of a parametrized test named ``*_many`` is a
    unit of its own: those are the long fuzz loops (a minute per case), and a file's worth of
    them on one worker made the slow run as long as all of them in a row."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.split("::")[-1]
            if "[" in test and test.split("[", 1)[0].endswith("_many"):
                return nodeid
            return super()._split_scope(nodeid)

    return Scheduling(config, log)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "t.duckdb"


@pytest.fixture
def con(db_path: Path):
    from pipeline import store

    c = store.connect(db_path)
    yield c
    c.close()


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real data folder {REALDATA} is absent")
    return REALDATA


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """Headless Chromium after a preflight on a trivial page (tests/headless.py): skipped
    only when the browser itself cannot run; failures on our pages are test failures."""
    from .headless import browser_or_skip

    return browser_or_skip(tmp_path_factory.mktemp("chromium"))


@pytest.fixture
def string_channels(monkeypatch) -> list:
    """Chart channels built from a shorthand string while the test runs (assert the list is empty).

    Altair builds a channel given as a string ("t_s:Q") by hashing every schema class it has,
    about 5 ms a channel; tracelat's charts pass channel objects (alt.X(...)) instead."""
    from altair.utils import schemapi

    seen: list = []
    real_init = schemapi._FromDict.__init__
    monkeypatch.setattr(schemapi._FromDict, "__init__", lambda self, *a: seen.append(1) or real_init(self, *a))
    return seen
