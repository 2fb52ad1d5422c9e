"""Escaping for every output format: strings from logs are data, never markup.

Run ids, model names, request ids and metadata come from files anyone can write,
so each output escapes them for its own syntax:

* HTML text and attributes: :func:`html_text` (``& < > " '``).
* JSON inside ``<script>``: :func:`script_json`; ``<``, ``>``, ``&`` and the JS line
  separators U+2028/9 become ``\\uXXXX`` escapes, so neither ``</script>`` nor
  ``<!--`` can appear in the page while the parsed JSON is unchanged.
* Markdown (PR comments, table cells): :func:`md_text`; markup characters, ``< > &``
  included, take a backslash (CommonMark's escape for any ASCII punctuation), so
  ``<script>`` stays text and a summary printed to a terminal reads ``\\<=``, not ``&lt;=``.
* XML (JUnit): :func:`xml_clean` drops characters XML 1.0 cannot hold (ElementTree
  escapes the rest).

File names are hostile too: DuckDB's and Polars' readers take a path as a glob pattern
and expand a leading ``~``, so a log named ``[ab].jsonl`` would read ``a.jsonl`` and
``b.jsonl`` instead. :func:`glob_literal` turns a path into the pattern that matches
only that file.
"""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any

_SCRIPT_UNSAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_XML_INVALID = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# DuckDB's glob syntax (* ? [...]); inside brackets each of these stands for itself
_GLOB_SPECIAL = re.compile(r"([\[\]*?])")
# characters that can start markup inside a line (links need "[", images "![", so "(" and "!" are
# inert); "<" starts raw HTML and autolinks, "&" an entity
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]|~<>&])")
# what opens a block at the start of a line: a heading's #, a list's - or + and a space, a rule or
# setext underline (--- ===), an ordered list's 1. or 1) and a space
_MD_BLOCK_START = re.compile(r"^(\d*)(#|[-+=](?=\s|[-=]*$)|(?<=\d)[.)](?=\s|$))")


def html_text(value: Any, limit: int | None = None) -> str:
    """``value`` as HTML text (safe in element content and quoted attributes)."""
    # control and bidi characters from logs (ESC, BEL, U+202E that reverses the text shown) become
    # spaces; tabs and line breaks are plain whitespace in HTML and stay
    s = "" if value is None else _HTML_CONTROLS.sub(" ", str(value))
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "\u2026"
    return html.escape(s, quote=True)


def script_json(obj: Any, **kwargs: Any) -> str:
    """JSON that can sit inside ``<script>`` without ending it or opening a comment."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, **kwargs)
    return re.sub("[<>&\u2028\u2029]", lambda m: _SCRIPT_UNSAFE[m.group()], text)


# C0 and C1 controls (ESC among them) and bidi formatting characters: none belongs in a report,
# and a Markdown file is also read in terminals (cat, less -R). HTML text keeps tab, line feed and
# carriage return (plain whitespace there); Markdown text is one line, so _CONTROLS takes them too.
_HTML_CONTROLS = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
_CONTROLS = re.compile("[\t\n\r]|" + _HTML_CONTROLS.pattern)


def md_text(value: Any, limit: int | None = 120) -> str:
    """``value`` as inline Markdown text: no markup, no raw HTML, no control characters, one line."""
    s = "" if value is None else " ".join(_CONTROLS.sub(" ", str(value)).split())
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "\u2026"
    s = _MD_SPECIAL.sub(r"\\\1", s)
    # a value that starts a line (after "- " too) must not open a block: a heading, a list, a rule
    return _MD_BLOCK_START.sub(r"\1\\\2", s, count=1)


def xml_clean(value: Any) -> str:
    """``value`` as a string XML 1.0 can hold (invalid characters become U+FFFD)."""
    return _XML_INVALID.sub("\ufffd", "" if value is None else str(value))


def glob_literal(path: Any) -> str:
    """``path`` as a DuckDB file pattern that matches that one file and no other.

    Absolute, so a relative name starting with ``~`` is not taken for the home folder;
    each of ``[ ] * ?`` in a bracket of its own, so it stands for itself.
    """
    return _GLOB_SPECIAL.sub(r"[\1]", os.path.abspath(os.fspath(path)))


def not_utf8(path: Any) -> str | None:
    """How ``path`` is shown when its name is not UTF-8 (its bytes, undecodable ones as ``\\xNN``),
    else None. POSIX names are bytes: Python keeps a byte UTF-8 cannot decode as a lone surrogate,
    which DuckDB, JSON and a UTF-8 terminal all refuse, so such a name is stopped at the door."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(text).decode("utf-8", "backslashreplace")
    return None
