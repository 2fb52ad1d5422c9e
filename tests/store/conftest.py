"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from pipeline import store


@pytest.fixture
def own_scratch(monkeypatch):
    """A scratch database of the test's own: a limit it sets ends with it (the process's comes back)."""
    monkeypatch.setattr(store, "_SCRATCH", None)
    monkeypatch.setattr(store, "_SCRATCH_LIMIT", None)
