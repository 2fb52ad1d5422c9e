"""The vega-embed bundle is built once per vl-convert and Vega-Lite version, then read from the cache."""

from __future__ import annotations

import pytest
import vl_convert

from pipeline.report import bundle


@pytest.fixture
def built(monkeypatch, tmp_path) -> list[str]:
    """vl-convert's build replaced by a counted stand-in; the cache in tmp_path/cache."""
    calls: list[str] = []

    def fake(vl_version: str) -> str:
        calls.append(vl_version)
        return f"/* bundle for {vl_version} */ var vega = {{}};"

    monkeypatch.setattr(vl_convert, "javascript_bundle", fake)
    monkeypatch.setenv("TRACELAT_CACHE_DIR", str(tmp_path / "cache"))
    bundle.vega_bundle.cache_clear()
    yield calls
    bundle.vega_bundle.cache_clear()


def _again() -> str:
    bundle.vega_bundle.cache_clear()  # as a new process would
    return bundle.vega_bundle()


def test_built_once_then_read_from_the_cache(built, tmp_path):
    first = bundle.vega_bundle()
    assert len(built) == 1 and first.startswith("/* bundle for ")
    (cached,) = (tmp_path / "cache").glob("vega-embed-*.js")
    assert vl_convert.__version__ in cached.name and built[0] in cached.name
    assert _again() == first and len(built) == 1


def test_a_file_cut_short_or_unreadable_is_built_again(built, tmp_path):
    first = bundle.vega_bundle()
    (cached,) = (tmp_path / "cache").glob("vega-embed-*.js")
    cached.write_bytes(cached.read_bytes()[:-5])
    assert _again() == first and len(built) == 2
    cached.write_bytes(b"\xff\xfe not utf-8")
    assert _again() == first and len(built) == 3
    assert _again() == first and len(built) == 3  # the rebuilt file is whole again


def test_another_vl_convert_release_builds_its_own(built, monkeypatch, tmp_path):
    bundle.vega_bundle()
    monkeypatch.setattr(vl_convert, "__version__", "9.9/../x")  # hostile: stays a file name in the folder
    _again()
    assert len(built) == 2
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(names) == 2 and any("9.9_.._x" in n for n in names), names


def test_a_cache_that_cannot_be_written_is_no_error(built, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TRACELAT_CACHE_DIR", str(blocker / "cache"))  # a folder under a file
    assert bundle.vega_bundle().startswith("/* bundle for ") and len(built) == 1
    assert _again() and len(built) == 2


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACELAT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundle.cache_dir() == tmp_path / "xdg" / "tracelat"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bundle.cache_dir() == tmp_path / "home" / ".cache" / "tracelat"
