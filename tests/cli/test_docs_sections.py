"""Documentation coverage beyond test_docs_coverage.py (issue 16 item 6, the datasette-style tests):
every option explains itself, the top-level options are in the reference, and every format
the ingest registry holds (not only the list in pipeline/formats.py) has a section of its
own in the docs and a line in `tracelat ingest --help`."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]


def _commands():
    from pipeline.cli import COMMANDS, cli

    yield "tracelat", cli
    for name, (module, attr, _) in sorted(COMMANDS.items()):
        yield f"tracelat {name}", getattr(importlib.import_module(module), attr)


def test_every_option_has_help_text():
    missing = [
        f"{name} {'/'.join(p.opts)}"
        for name, cmd in _commands()
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert not missing, f"options without help (docs/cli.md would show a bare name): {missing}"


def test_top_level_options_are_in_the_reference():
    from pipeline.cli import cli

    reference = (ROOT / "docs" / "cli.md").read_text()
    section = reference.split("## tracelat\n", 1)[1].split("\n## ", 1)[0]
    for p in cli.params:
        for opt in (*p.opts, *p.secondary_opts):
            if opt.startswith("--"):
                assert re.search(re.escape(opt) + r"\b", section), f"tracelat {opt} missing from docs/cli.md"


def _registry() -> list[str]:
    from pipeline import ingest

    ingest._load_plugins()  # engine ingestors register on import
    return list(ingest.INGESTORS)


def test_every_registered_format_has_a_docs_section():
    formats_doc = (ROOT / "docs" / "formats.md").read_text()
    canonical_doc = (ROOT / "docs" / "canonical-format.md").read_text()
    headings = "\n".join(re.findall(r"^#{2,3} .*$", formats_doc, flags=re.M))
    for name in _registry():
        if name in ("jsonl", "parquet"):  # the canonical format has a page of its own
            assert ("JSON Lines" if name == "jsonl" else "Parquet") in canonical_doc, name
            continue
        assert f"`{name}`" in headings, f"docs/formats.md has no section (## ... (`{name}`)) for {name}"


def test_every_registered_format_is_listed_in_ingest_help():
    reference = (ROOT / "docs" / "cli.md").read_text()
    section = reference.split("## tracelat ingest\n", 1)[1].split("\n## ", 1)[0]
    for name in _registry():
        assert re.search(rf"^\s+{re.escape(name)}\s", section, flags=re.M), f"`tracelat ingest --help` lacks {name}"
