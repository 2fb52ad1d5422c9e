"""The vega-embed JavaScript bundle every page inlines, kept on disk between commands.

vl-convert builds the bundle (Vega, Vega-Lite, vega-embed) when asked, which takes about 2 s:
more than half of a ``tracelat report`` of a small run. The bundle depends only on the
vl-convert release and the Vega-Lite version Altair asks for, so it is written once per pair
to the user's cache folder (``$TRACELAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tracelat``, else
``~/.cache/tracelat``) and read from there afterwards. The cache is only a shortcut: a folder
that cannot be made or written, or a file that cannot be read, means building the bundle as
before.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from pathlib import Path

# what a cached file must start with and end with: a file cut short is built again
_HEAD = "/* tracelat vega-embed bundle */\n"
_TAIL = "\n/* end */\n"


def cache_dir() -> Path:
    """The folder tracelat caches in; nothing is made here."""
    given = os.environ.get("TRACELAT_CACHE_DIR", "").strip()
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tracelat"


def _safe(text: str) -> str:
    # version strings become part of a file name: keep them to a file name's plain characters
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:40]


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not (text.startswith(_HEAD) and text.endswith(_TAIL)):
        return None
    return text[len(_HEAD) : -len(_TAIL)]


def _write(path: Path, bundle: str) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".bundle-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
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
    path = cache_dir() / f"vega-embed-{_safe(vl_convert.__version__)}-vl{_safe(vl)}.js"
    cached = _read(path)
    if cached is not None:
        return cached
    bundle = vl_convert.javascript_bundle(vl_version=vl)
    _write(path, bundle)
    return bundle
