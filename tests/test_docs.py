"""Docs that cannot drift: the command reference is `--help`, and the README keeps its promises."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragexam.cli.app import app
from ragexam.options import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
COMMANDS_PAGE = ROOT / "docs" / "commands.md"
MARKER = "## Command reference\n"
WIDTH = "100"


def reference() -> str:
    """The reference section: `ragexam --help`, then each command's, as a terminal shows them."""
    parts = [
        MARKER,
        "\nGenerated from `--help` at 100 columns; `RAGEXAM_UPDATE_DOCS=1 uv run pytest "
        "tests/test_docs.py` writes it again, and the test fails when it drifts.\n",
    ]
    for args in ([], *([spec.name] for spec in COMMANDS)):
        env = {"COLUMNS": WIDTH, "NO_COLOR": "1"}
        shown = CliRunner().invoke(app, [*args, "--help"], env=env, prog_name="ragexam")
        assert shown.exit_code == 0, shown.output
        title = " ".join(["ragexam", *args])
        text = "\n".join(line.rstrip() for line in shown.output.strip("\n").splitlines())
        parts.append(f"\n### `{title} --help`\n\n```text\n{text}\n```\n")
    return "".join(parts)


def test_the_command_reference_is_the_help_the_commands_print() -> None:
    page = COMMANDS_PAGE.read_text(encoding="utf-8")
    head = page[: page.index(MARKER)] if MARKER in page else page.rstrip() + "\n\n"
    current = head + reference()
    if os.environ.get("RAGEXAM_UPDATE_DOCS"):
        COMMANDS_PAGE.write_text(current, encoding="utf-8")
    assert page == current, "docs/commands.md drifted from --help: see the test's docstring"


def test_the_readme_is_a_front_page_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+?)(?:#[\w-]+)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_docs_link_resolves(page: Path) -> None:
    for target in re.findall(r"\]\(([\w./-]+?\.(?:md|png))(?:#[\w-]+)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name} links to {target}"
