"""`ragexam run` takes every option of the stages it runs, and --limit limits every stage."""

from __future__ import annotations

from pathlib import Path

import typer
from conftest import build_store, read_csv, run_cli
from openai_server import FakeOpenAI
from test_generate import docs

from ragexam.cli.app import app

NOT_FOR_RUN = {"--qa-dataset", "--answers"}  # run makes these files itself


def options_of(name: str) -> set[str]:
    """The long options of one subcommand, as the user sees them."""
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--")}


def test_run_has_every_option_of_its_stages() -> None:
    stages = set().union(*(options_of(name) for name in ("generate", "answer", "judge", "stats")))
    missing = stages - NOT_FOR_RUN - options_of("run")
    assert missing == set()
    assert {"--samples", "--scale", "--temperature", "--max-chunk-chars", "--seed"} <= stages
    # One name, two meanings: run's --controls adds the control runs, so judge's is renamed.
    assert "--judge-controls" in options_of("run")


def test_run_limit_applies_to_every_stage(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(10))
    env.embedding_dim = 16
    # A folder that already holds 10 questions, as after an earlier full generate.
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    before = env.count()
    args = ["run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e"]
    result = run_cli(
        *args, "--limit", "4", "--samples", "2", "--scale", "ten", "--judge-controls", "0"
    )
    assert result.exit_code == 0, result.output
    answers = read_csv(tmp_path / "run" / "answers.csv")
    judgments = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(read_csv(tmp_path / "run" / "qa_dataset.csv")) == 10
    assert len(answers) == 4 and len(judgments) == 4
    assert {(row["samples"], row["scale"]) for row in judgments} == {("2", "ten")}
    # generate had nothing left to do; 4 answers and 4 x 2 judge samples were asked for.
    assert env.count() - before == 4 + 8
