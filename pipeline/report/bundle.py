"""The vega-embed JavaScript bundle every page inlines, kept on disk between commands.

vl-convert builds the bundle (Vega, Vega-Lite, vega-embed) when asked, which takes about 2 s:
more than half of a ``tracelat report`` of a small run. The bundle depends only on the
vl-convert release and the Vega-Lite version Altair asks for, so it is written once per pair
to the user's cache folder (``$TRACELAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracelat``, else
``~/.cache/tracelat``) and read from there afterwards.

The cached script is inlined into every page and allowed by the page's Content-Security-Policy,
so the cache is trusted only as far as the user's own files: a folder or file that is not the
user's, that group or others may write, or that is a symbolic link is neither read nor written.
The cache is only a shortcut: whenever it cannot be used the bundle is built as before.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
import tempfile
import time
from pathlib import Path

# what a cached file must start with and end with: a file cut short is built again
_HEAD = "/* tracelat vega-embed bundle */\n"
_TAIL = "\n/* end */\n"
_STALE_TMP_S = 3600.0  # a writer's temporary file this old was left by a killed process


def cache_dir() -> Path | None:
    """The folder tracelat caches in (nothing is made here); None without a home to put it in."""
    given = os.environ.get("TRACELAT_CACHE_DIR", "").strip()
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg:
        return Path(xdg) / "tracelat"
    try:
        return Path.home() / ".cache" / "tracelat"
    except RuntimeError:  # no HOME and no password entry
        return None


def _file_name(vl_convert_version: str, vl_version: str) -> str:
    # version strings become a file name: plain characters, plus a digest of the exact strings
    # so that two versions the cleaning maps alike still get files of their own
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", f"{vl_convert_version}-{vl_version}")[:40]
    digest = hashlib.sha256(f"{vl_convert_version}\0{vl_version}".encode()).hexdigest()[:12]
    return f"vega-embed-{plain}-{digest}.js"


def _ours(st: os.stat_result) -> bool:
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _usable_folder(folder: Path) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _ours(st)


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _ours(st)):
            return None
        with os.fdopen(fd, encoding="utf-8", newline="") as f:  # newline="": the bytes as written
            fd = -1
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    if not (text.startswith(_HEAD) and text.endswith(_TAIL)):
        return None
    return text[len(_HEAD) : -len(_TAIL)]


def _write(folder: Path, path: Path, bundle: str) -> None:
    try:
        for old in folder.glob(".bundle-*.tmp"):
            if time.time() - old.lstat().st_mtime > _STALE_TMP_S:
                old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".bundle-", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(_HEAD + bundle + _TAIL)
            os.replace(tmp, path)  # whole or not at all, also against a second writer
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a cache that cannot be written is no cache


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """The vega-embed bundle for Altair's Vega-Lite version, from the cache when it holds it."""
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    vl = vl_version_for_vl_convert()
    folder = cache_dir() if hasattr(os, "getuid") and hasattr(os, "O_NOFOLLOW") else None
    if folder is not None:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            folder = None
    if folder is None or not _usable_folder(folder):
        return vl_convert.javascript_bundle(vl_version=vl)
    path = folder / _file_name(vl_convert.__version__, vl)
    cached = _read(path)
    if cached is not None:
        return cached
    bundle = vl_convert.javascript_bundle(vl_version=vl)
    _write(folder, path, bundle)
    return bundle
