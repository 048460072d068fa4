"""What a newcomer sees: help that shows every default, a plain --force flag, --version, and
summary lines and tables that fit an 80-column terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from rich.console import Console
from support import build_store, run_cli

from ragexam import __version__
from ragexam.cli import display


def test_help_shows_defaults_in_brackets_and_force_as_a_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per option
    stats = run_cli("stats", "--help")
    assert "Metrics cutoff [answer's k, else 5]." in stats.output
    judge = run_cli("judge", "--help").output
    assert "structured output [json_schema]." in judge
    assert "Questions [OUT/qa_dataset.csv]." in judge
    force = next(line for line in judge.splitlines() if "--force" in line)
    assert "Redo rows" in force and "<bool>" not in judge  # no flag looks like it takes a value


def test_version() -> None:
    result = run_cli("--version")
    assert result.exit_code == 0 and result.output == f"ragexam {__version__}\n"


def test_force_is_a_flag_that_takes_no_value(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs_with_long_names(3))
    assert run_cli("generate", "--chroma", str(store), "--force").exit_code == 0
    extra = run_cli("generate", "--chroma", str(store), "--force", "true")
    assert extra.exit_code == 2 and "unexpected extra argument" in extra.output


LONG = "/home/someone/projects/acme/knowledge-base/exports/2024/handbook/section"


def docs_with_long_names(n: int) -> list[Document]:
    """n chunks over three documents with long, path-like names."""
    return [
        Document(
            f"Fact {i}: widget {i} weighs {i} grams.", metadata={"source": f"{LONG}-{i % 3}.md"}
        )
        for i in range(n)
    ]


def test_summary_and_table_fit_80_columns(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs_with_long_names(9))
    env.embedding_dim = 16
    result = run_cli("run", "--chroma", str(store), "--embedding", "openai:e", "--controls", "0")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Worst" in line)
    end = next(i for i, line in enumerate(lines) if "summary_by_document.csv" in line)
    table = lines[start : end + 1]
    assert all(len(line) <= 80 for line in table), max(table, key=len)  # the table fits
    # A log is not a terminal: each summary line stays whole, at any width, for grep.
    whole = [line for line in lines if "rows/s overall" in line]
    assert len(whole) == 3 and all("tokens" in line and " out" in line for line in whole)
    # The bar's speed is "now"; the summary's is over the whole stage, setup included.
    assert sum("rows/s overall" in line for line in lines) == 3
    assert any("tokens " in line and " in + " in line for line in lines)
    for i in range(3):  # each document on one line, by its name in the folder all share
        assert sum(f" section-{i}.md " in line for line in lines) == 1
    assert result.output.count("/home/someone") == 1  # the folder, said once in the title
    assert "…" not in "\n".join(table)  # no figure cut, nor any name


def test_a_terminal_is_told_what_happens_before_the_first_bar(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs_with_long_names(3))
    screen = io.StringIO()
    monkeypatch.setattr(display, "err", Console(file=screen, force_terminal=True, width=100))
    assert run_cli("generate", "--chroma", str(store)).exit_code == 0
    shown = screen.getvalue()
    assert "generate: loading libraries, opening the store" in shown
    assert shown.index("opening the store") < shown.index("rows/s now")
    assert display.Starting.status is None
