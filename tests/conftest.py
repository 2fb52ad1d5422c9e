"""Shared fixtures: a fresh store per test, and the shared real-data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REALDATA = Path(os.environ.get("TRACELAT_REALDATA", REPO.parent / "shared" / "realdata"))


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
