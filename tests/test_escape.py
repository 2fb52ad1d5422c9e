"""Markdown escaping checked by a CommonMark parser: what md_text makes of any string renders
as that string's text (spaces collapsed), with no element of its own."""

from __future__ import annotations

import html

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from pipeline.escape import md_text

# html enabled: raw HTML in the source would pass through, so an escape that failed would show
MD = MarkdownIt("commonmark", {"html": True}).enable("table")
HOSTILE = [
    "<script>alert(1)</script>",
    "ttft_ms.p99 <= 2000",
    "a & b &amp; &lt;",
    "[x](javascript:alert(1))",
    "![i](http://x/y.png)",
    "<http://evil.example>",
    "**bold** _it_ `code` ~~s~~",
    "a | b",
    "x\\<y",
]


def _text(s: str) -> str:
    return " ".join(s.split())


def _renders_as_text(s: str) -> None:
    out = MD.render(md_text(s, limit=None))
    if not _text(s):
        assert out == ""
        return
    assert out.startswith("<p>") and out.endswith("</p>\n"), (s, out)
    inner = out[3:-5]
    assert "<" not in inner and html.unescape(inner) == _text(s), (s, out)


@pytest.mark.parametrize("s", HOSTILE)
def test_hostile_strings_render_as_themselves(s):
    _renders_as_text(s)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab <>&*_`[]()!|~\\{}#-+.:/\"'=")), max_size=30))
def test_any_punctuation_renders_as_itself(s):
    # a leading "#", "- ", "+ ", "---" or "1. " would start a block: md_text escapes it, since a
    # value may start a line of the Markdown (a nightly input's name in a list item)
    _renders_as_text(_text(s))


@pytest.mark.parametrize("s", ["# PASS: all nights green", "- fake item", "+ x", "---", "===", "1. one", "12) two"])
def test_a_value_that_would_open_a_block_renders_as_itself(s):
    _renders_as_text(s)
    out = MD.render("- " + md_text(s) + "\n")  # as a list item's text, where nightly.md puts file names
    assert out.count("<li>") == 1 and "<h1>" not in out and "<ol" not in out and "<hr" not in out, out


def test_table_cell_keeps_its_pipe():
    row = f"| {md_text('a|b <i>')} | c |"
    out = MD.render("| h | k |\n|---|---|\n" + row + "\n")
    assert "<td>a|b &lt;i&gt;</td>" in out and "<i>" not in out


def test_terminal_reads_operators_without_entities():
    # the nightly summary goes to a terminal too: "<=" as "\<=", never "&lt;="
    assert md_text("ttft_ms.p99 <= 2000") == "ttft\\_ms.p99 \\<= 2000"


def test_html_text_drops_control_and_bidi_characters():
    """A log's ESC sequences, BEL and U+202E (which shows the text after it reversed) never reach a
    page; tabs and line breaks (plain whitespace in HTML) stay, and markup is still escaped."""
    from pipeline.escape import html_text

    got = html_text("e\x1b]0;PWNED\x07\x1b[31m<b>RED\x1b[0m\u202eevil\u2066x\tx\ny\x85")
    assert not any(ch in got for ch in "\x1b\x07\u202e\u2066\x85<>")
    assert "&lt;b&gt;RED" in got and "\tx\ny" in got
