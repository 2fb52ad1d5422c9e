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
