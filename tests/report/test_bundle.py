"""The vega-embed bundle is built once per vl-convert and Vega-Lite version, then read from the
cache; a cache that is not the user's alone is never read."""

from __future__ import annotations

import os
import time

import pytest
import vl_convert

from pipeline.report import bundle


@pytest.fixture
def built(monkeypatch, tmp_path) -> list[str]:
    """vl-convert's build replaced by a counted stand-in; the cache in tmp_path/cache."""
    calls: list[str] = []

    def fake(vl_version: str) -> str:
        calls.append(vl_version)
        return f"/* bundle for {vl_version} */ var vega = {{}}; var s = `a\r\nb\rc`;"

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


EVIL = '/* tracelat vega-embed bundle */\nalert("planted")\n/* end */\n'


def _cached_file(tmp_path):
    bundle.vega_bundle()
    (cached,) = (tmp_path / "cache").glob("vega-embed-*.js")
    return cached


def test_line_ends_come_back_as_they_were_built(built, tmp_path):
    first = bundle.vega_bundle()
    assert "\r\n" in first and _again() == first and len(built) == 1


def test_a_file_others_may_write_is_not_read_and_is_replaced(built, tmp_path):
    cached = _cached_file(tmp_path)
    cached.write_text(EVIL)
    cached.chmod(0o666)
    assert "planted" not in _again() and len(built) == 2
    assert "planted" not in cached.read_text() and cached.stat().st_mode & 0o077 == 0


def test_a_link_in_the_cache_is_not_followed(built, tmp_path):
    cached = _cached_file(tmp_path)
    evil = tmp_path / "evil.js"
    evil.write_text(EVIL)
    evil.chmod(0o600)
    cached.unlink()
    cached.symlink_to(evil)
    assert "planted" not in _again() and len(built) == 2
    assert evil.read_text() == EVIL  # the link is replaced, its target left alone


def test_a_folder_others_may_write_is_not_used(built, tmp_path):
    cached = _cached_file(tmp_path)
    cached.write_text(EVIL)
    cached.chmod(0o600)
    (tmp_path / "cache").chmod(0o777)
    assert "planted" not in _again() and len(built) == 2
    assert cached.read_text() == EVIL  # neither read nor written


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_of_another_user_is_not_read(built, tmp_path):
    cached = _cached_file(tmp_path)
    cached.write_text(EVIL)
    cached.chmod(0o600)
    os.chown(cached, 12345, -1)
    assert "planted" not in _again() and len(built) == 2


def test_a_killed_writers_old_temporary_file_is_removed(built, tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    old, fresh = folder / ".bundle-old.tmp", folder / ".bundle-new.tmp"
    for p in (old, fresh):
        p.write_text("half")
    hour_ago = time.time() - 2 * 3600
    os.utime(old, (hour_ago, hour_ago))
    bundle.vega_bundle()
    assert not old.exists() and fresh.exists()  # a fresh one may be another writer's


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACELAT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundle.cache_dir() == tmp_path / "xdg" / "tracelat"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bundle.cache_dir() == tmp_path / "home" / ".cache" / "tracelat"


def test_without_a_home_the_bundle_is_built(built, monkeypatch):
    monkeypatch.delenv("TRACELAT_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(bundle.Path, "home", staticmethod(no_home))
    assert bundle.cache_dir() is None
    assert bundle.vega_bundle().startswith("/* bundle for ") and len(built) == 1
