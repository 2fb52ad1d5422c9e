"""The documentation covers the product: every command and option, every input format."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]


def test_command_reference_is_current():
    # A fresh process, as the regeneration command runs: click caches each command's help option
    # the first time it is built, so a test that invoked a command on its own (no parent context,
    # hence no -h) would change what render() prints in this process.
    rendered = subprocess.run(
        [sys.executable, "-m", "pipeline.clidoc"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert (ROOT / "docs" / "cli.md").read_text() == rendered, (
        "docs/cli.md is stale: regenerate it with `python -m pipeline.clidoc > docs/cli.md`"
    )


def test_every_command_and_option_is_documented():
    from pipeline.cli import COMMANDS

    reference = (ROOT / "docs" / "cli.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name, (module, attr, _) in COMMANDS.items():
        assert f"tracelat {name}" in readme, f"README does not mention `tracelat {name}`"
        cmd = getattr(importlib.import_module(module), attr)
        section = reference.split(f"## tracelat {name}\n", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            for opt in (*p.opts, *p.secondary_opts):
                if opt.startswith("--"):
                    assert re.search(re.escape(opt) + r"\b", section), f"{name} {opt} missing from docs/cli.md"


def test_every_format_has_a_fixture_and_a_docs_row():
    from pipeline.formats import FORMATS
    from pipeline.ingest import detect

    formats_doc = (ROOT / "docs" / "formats.md").read_text()
    found: dict[str, list[Path]] = {}
    for f in sorted((ROOT / "fixtures").rglob("*")):
        if f.is_file() and f.suffix not in (".md",) and "truth" not in f.name:
            try:
                found.setdefault(detect(f).name, []).append(f)
            except Exception:  # noqa: BLE001 - files of no known format (notes, configs) are not the point
                continue
    for name, _ in FORMATS:
        assert f"`{name}`" in formats_doc, f"docs/formats.md has no row for {name}"
        if name != "parquet":  # made on the fly by tests/ingest (a binary fixture would only duplicate jsonl's)
            assert found.get(name), f"no fixture under fixtures/ is detected as {name}"


def test_no_reference_to_a_spec_outside_the_repository():
    """Code, queries and docs point readers to docs/, not to a specification the repository
    does not hold (``SPEC §4``), and user-facing text says "iteration-time claims", not "the seed
    document" nobody can open."""
    from pipeline.cli import cli

    pattern = re.compile(r"SPEC\s*§|\bSPEC\b (?:summary|section)|notes/anchors|seed (?:document|claims)", re.I)
    offenders = []
    for folder, globs in (("pipeline", ("*.py", "*.toml")), ("docs", ("*.md",)), ("queries", ("*.sql",))):
        for g in globs:
            for path in sorted((ROOT / folder).rglob(g)):
                for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if pattern.search(line):
                        offenders.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    offenders += [f"README.md: {m.group(0)}" for m in pattern.finditer(readme)]
    with click.Context(cli, info_name="tracelat") as ctx:
        offenders += [f"tracelat --help: {m.group(0)}" for m in pattern.finditer(cli.get_help(ctx))]
    assert not offenders, "\n".join(offenders)
    # the test can fail: the pattern finds what it must
    assert pattern.search("the store rules of SPEC §4") and pattern.search("seed claims, checked")
