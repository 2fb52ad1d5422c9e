"""Terminal output: text from logs is shown, never obeyed.

Run ids, model names, file names and rejected lines come from files anyone can
write; printed raw, an escape sequence among them could move the cursor, rewrite
earlier lines, retitle the window or hide text (a log that rewrites the terminal).
Every line the CLI prints goes through :func:`echo`, which drops escape sequences
whole (so no parameter text is left behind) and then every other control
character but tab and newline: C0 (carriage return too, which overwrites the
line), DEL and C1, and the bidi formatting characters (U+202E and its kin reorder what
is shown).

Newline is kept because the CLI's own messages span lines; what a log names is kept
single-line where it comes in: run ids holding any of these characters, newline and
tab too (:data:`UNSAFE_IN_ID`), are refused at ingest; request ids, which must stay as the
log has them to join steps to requests, are shown quoted and escaped (:func:`inline`).
"""

from __future__ import annotations

import re
from typing import Any

import click

# ESC-introduced sequences: CSI (ESC [ params final), OSC/DCS/SOS/PM/APC strings up to
# BEL or ST (ESC \), and the two-character escapes (ESC + one character); then the same
# with the 8-bit C1 introducers (CSI U+009B; DCS, SOS, OSC, PM, APC up to BEL or ST U+009C)
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)|\x1b.?"
    r"|\x9b[0-?]*[ -/]*[@-~]?|[\x90\x98\x9d\x9e\x9f].*?(?:\x07|\x9c|\x1b\\|$)",
    re.S,
)
# Bidi formatting characters (Unicode's Bidi_Control): embeddings, overrides, isolates, marks
BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# Unicode's line and paragraph separators: some terminals break the line at them
SEPARATORS = "\u2028\u2029"
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{BIDI}{SEPARATORS}]")
# Characters that show as nothing: two run ids differing by one would look the same
INVISIBLE = "\u200b\u2060\ufeff"
# What a name from a log (a run id) may not hold at all: every C0 control (tab, CR, LF
# too), DEL, C1, the bidi formatting characters, the line separators and the invisible ones
UNSAFE_IN_ID = re.compile(f"[\x00-\x1f\x7f-\x9f{BIDI}{SEPARATORS}{INVISIBLE}]")


def clean(text: str) -> str:
    """``text`` without terminal escape sequences, control or bidi formatting characters
    (tab and newline kept)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def shown_id(text: str) -> str:
    """``text`` quoted with its unsafe characters escaped (``'esc\\nfake'``, ``'\\u202e'``),
    for naming a refused id on one line."""
    return repr(text)


def inline(value: Any) -> str:
    """A name from a log (a request id) placed in a line of ours: quoted with its unsafe characters
    escaped when it holds any (a newline in it would print a line of its own that looks like ours),
    else as it is."""
    text = str(value)
    return shown_id(text) if UNSAFE_IN_ID.search(text) else text


def one_line(text: Any) -> str:
    """A message of one line that carries text from a log or a file name (a warning, a reject's
    reason): its line breaks written as ``\\n`` so no part of it can pass for a line of ours."""
    return re.sub(r"[\n\r\x0b\x0c\x85\u2028\u2029]", lambda m: repr(m.group())[1:-1], str(text))


class OutputClosed(Exception):
    """The reader of our output went away (``tracelat ... | head``): the CLI stops quietly with
    the status a shell gives a process killed by SIGPIPE, 141, not 1 ("a check failed")."""

    exit_code = 141


def echo(message: Any = None, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of the cleaned text."""
    try:
        click.echo(None if message is None else clean(str(message)), err=err, nl=nl)
    except BrokenPipeError as exc:  # not an OSError for click to turn into exit code 1
        raise OutputClosed() from exc


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 check``, ``2 checks``: a count with its noun in the right number (``plural`` when the
    noun does not take an s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
