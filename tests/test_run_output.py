"""What `run` says at its end: the cost of every stage it ran, and the judge's verdict once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import judges
import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from support import build_store, docs, run_cli

# USD per million tokens: high, so the total is dollars and the screen shows it to the cent.
PRICE_INPUT, PRICE_OUTPUT = 100.0, 400.0


def manifest(folder: Path) -> dict[str, Any]:
    """A run folder's manifest."""
    data: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    return data


def billed_dollars(env: FakeOpenAI) -> float:
    """What the test server's chat replies billed, priced at PRICE_INPUT and PRICE_OUTPUT."""
    usages = [request.usage for request in env.requests if request.usage is not None]
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    completion = sum(usage["completion_tokens"] for usage in usages)
    assert prompt > 0 and completion > 0
    return (prompt * PRICE_INPUT + completion * PRICE_OUTPUT) / 1e6


def exam_store(env: FakeOpenAI, tmp_path: Path, chunks: int = 8) -> tuple[str, ...]:
    """A store LangChain built (ids kept), and the options that point `run` at it."""
    env.embedding_dim = 16
    kept = [Document(d.page_content, id=d.id) for d in docs(chunks)]
    store = build_store(tmp_path / "store", kept)
    return ("--chroma", str(store), "--out", "run", "--embedding", "openai:embedder")


def test_run_cost_covers_every_stage_and_the_control_runs(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", str(PRICE_INPUT))
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", str(PRICE_OUTPUT))
    result = run_cli("run", *exam_store(env, tmp_path), "--controls", "--judge-controls", "2")
    assert result.exit_code == 0, result.output
    expected = billed_dollars(env)
    recorded = manifest(tmp_path / "run")
    assert recorded["cost_usd"] == pytest.approx(expected)
    # said as recorded: the stages' sum, which may round the other way from `expected` when it
    # falls on half a cent (1.695 from eight stages' costs here)
    said = f"run cost: ${recorded['cost_usd']:,.2f}, 8 stages (closed_book and gold runs included)"
    assert said in result.output
    assert set(recorded["cost_stages"]) == {
        "generate",
        "answer",
        "judge",
        "judge_controls",
        "gold/answer",
        "gold/judge",
        "closed_book/answer",
        "closed_book/judge",
    }
    # The control runs' folders hold their own part, which the run's total takes in.
    gold, closed = manifest(tmp_path / "run" / "gold"), manifest(tmp_path / "run" / "closed_book")
    assert 0 < gold["cost_usd"] < expected and 0 < closed["cost_usd"] < expected


def test_one_unpriced_stage_makes_the_total_unknown_and_the_known_part_is_labelled(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("RAGEXAM_JUDGE_MODEL", "my-local-judge")  # not in any price table
    result = run_cli("run", *exam_store(env, tmp_path), "--judge-controls", "0")
    assert result.exit_code == 0, result.output
    assert manifest(tmp_path / "run")["cost_usd"] is None
    # gpt-4o-mini's list price, USD per million tokens, for generate and answer alone.
    judged = [r for r in env.requests if "<ground_truth>" in json.dumps(r.body)]
    asked = [r.usage for r in env.requests if r.usage is not None and r not in judged]
    prompt = sum(usage["prompt_tokens"] for usage in asked)
    completion = sum(usage["completion_tokens"] for usage in asked)
    part = (prompt * 0.15 + completion * 0.60) / 1e6
    line = next(line for line in result.output.splitlines() if line.startswith("run cost"))
    assert line == f"run cost: unknown: no price for judge; the priced stages alone: ${part:.4f}"


def test_run_says_the_judge_controls_verdict_once_beside_the_scores(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.responder = judges.constant  # 0.8 and 0.8 whatever it is shown: fails most controls
    result = run_cli("run", *exam_store(env, tmp_path), "--judge-controls", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    warnings = [i for i, line in enumerate(lines) if "judge controls passed" in line]
    assert len(warnings) == 1, result.output
    # 3 questions x 4 kinds; only the verbatim answers deserve 0.8 and 0.8.
    assert lines[warnings[0]].startswith("Warning: only 3/12 judge controls passed")
    table = next(i for i, line in enumerate(lines) if line.strip().startswith("ALL"))
    assert table < warnings[0]  # said after the table of scores it qualifies


def test_run_dry_run_estimates_the_answers_in_the_context_asked(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    args = ("run", *exam_store(env, tmp_path), "--judge-controls", "0", "--controls")
    result = run_cli(*args, "--context", "none", "--dry-run")
    assert result.exit_code == 0, result.output
    assert env.count() == 0
    tokens = {}
    for line in result.output.splitlines():
        if line.startswith("answer"):
            stage, rest = line.split(":", 1)
            tokens[stage] = int(rest.split("~")[1].split()[0].replace(",", ""))
    # Asked for no context, the run's answers are the closed-book control run's prompts,
    # and the gold run's (one chunk each) are longer.
    assert tokens["answer"] == tokens["answer_closed_book"] < tokens["answer_gold"], tokens
