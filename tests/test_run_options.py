"""`ragexam run` takes every option of the stages it runs, and --limit limits every stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from openai_server import FakeOpenAI, Reply
from support import build_store, docs, read_csv, run_cli

import ragexam
from ragexam.cli.app import app
from ragexam.options import Deprecated

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
    # One name, one meaning: --controls is the judge's known answers on run as on judge;
    # the gold and closed-book runs are --control-runs.
    assert {"--controls", "--control-runs"} <= options_of("run")
    assert "--control-runs" not in options_of("judge")


def test_run_limit_applies_to_every_stage(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(10))
    env.embedding_dim = 16
    # A folder that already holds 10 questions, as after an earlier full generate.
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    before = env.count()
    args = ["run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e"]
    result = run_cli(*args, "--limit", "4", "--samples", "2", "--scale", "ten", "--controls", "0")
    assert result.exit_code == 0, result.output
    answers = read_csv(tmp_path / "run" / "answers.csv")
    judgments = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(read_csv(tmp_path / "run" / "qa_dataset.csv")) == 10
    assert len(answers) == 4 and len(judgments) == 4
    assert {(row["samples"], row["scale"]) for row in judgments} == {("2", "ten")}
    # generate had nothing left to do; 4 answers and 4 x 2 judge samples were asked for.
    assert env.count() - before == 4 + 8


def test_old_spellings_still_work_and_say_what_to_use(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(build_store(tmp_path / "store", docs(4)))
    monkeypatch.setenv("RAGEXAM_EMBEDDING", "openai:e")  # the store has no function of its own
    old = run_cli("run", "--chroma", store, "--controls", "--judge-controls", "1", "--dry-run")
    new = run_cli("run", "--chroma", store, "--control-runs", "--controls", "1", "--dry-run")
    assert old.exit_code == new.exit_code == 0, old.output
    warned = [line for line in old.output.splitlines() if line.startswith("Warning:")]
    assert warned == [
        "Warning: run --controls with no number is deprecated: use --control-runs",
        "Warning: --judge-controls is deprecated: use --controls",
    ]
    assert old.output.replace("\n".join(warned) + "\n", "") == new.output  # the same estimates
    split = run_cli("generate", "--chroma", store, "--out", "s", "--split", "0.5", "--dry-run")
    assert split.exit_code == 0 and "use --validation" in split.output, split.output
    with pytest.warns(Deprecated, match="use --control-runs"):
        whole = ragexam.run(store, controls=True, dry_run=True)
    assert "answer_gold" in {estimate["stage"] for estimate in whole.figures["estimates"]}
    assert env.count() == 0


def test_without_batches_the_exams_grades_come_before_the_control_runs_answers(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    """On the sync road nothing is gained by answering the control runs first: a judge that
    fails is met before they pay."""

    def judge_refused(body: dict[str, object]) -> Reply | None:
        system = str(body["messages"][0]["content"])  # type: ignore[index]
        grader = system.startswith(("You are a strict, fair grader", "You mark an answer"))
        return Reply(status=400) if grader else None

    env.responder, env.embedding_dim = judge_refused, 16
    store = build_store(tmp_path / "store", docs(3))
    args = ("--chroma", str(store), "--out", "run", "--embedding", "openai:e", "--controls", "0")
    result = run_cli("run", *args, "--control-runs")
    assert result.exit_code == 1, result.output  # every grade an error row
    assert len(read_csv(tmp_path / "run" / "answers.csv")) == 3
    assert not (tmp_path / "run" / "gold" / "answers.csv").exists()


@pytest.mark.parametrize(
    "writing", [("--sample", "3"), ("--multi-hop", "2"), ("--check",), ("--exam-temperature", "1")]
)
def test_run_with_an_exam_refuses_the_options_that_write_one(
    env: FakeOpenAI, tmp_path: Path, writing: tuple[str, ...]
) -> None:
    # --qa-dataset skips generate: its options would be ignored, and all 6 questions paid for
    # where the user asked for 3
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(6))
    assert run_cli("generate", "--chroma", str(store), "--out", "exam").exit_code == 0
    calls = env.count()
    exam = str(tmp_path / "exam" / "qa_dataset.csv")
    result = run_cli("run", "--chroma", str(store), "--qa-dataset", exam, "--out", "run", *writing)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {writing[0]} write(s) the exam, and --qa-dataset")
    assert result.output.count("\n") == 1
    assert env.count() == calls and not (tmp_path / "run").exists()
