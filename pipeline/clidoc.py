"""docs/cli.md: every command's ``--help``, rendered from the commands themselves.

    python -m pipeline.clidoc > docs/cli.md

tests/cli/test_docs_coverage.py checks that the file is current and that every
command and option appears in it, so the reference cannot drift from the code.
"""

from __future__ import annotations

import importlib

import click

WIDTH = 100


def render() -> str:
    from .cli import COMMANDS, cli

    parts = [
        "# Command reference",
        "",
        "Generated from the commands' own help (`python -m pipeline.clidoc > docs/cli.md`); "
        "the README has the overview.",
        "",
    ]
    # make_context applies the group's context_settings (-h/--help), as a real invocation does
    root = cli.make_context("tracelat", [], resilient_parsing=True, terminal_width=WIDTH, max_content_width=WIDTH)
    parts += ["## tracelat", "", "```", cli.get_help(root).rstrip(), "```", ""]
    for name in sorted(COMMANDS):
        module, attr, _ = COMMANDS[name]
        cmd = getattr(importlib.import_module(module), attr)
        ctx = click.Context(cmd, info_name=name, parent=root, terminal_width=WIDTH, max_content_width=WIDTH)
        parts += [f"## tracelat {name}", "", "```", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
