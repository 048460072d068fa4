"""Cost in dollars, after a run and before it (--dry-run), through the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from support import (
    build_store,
    docs,
    exam,
    gpt_like_tokens,
    read_csv,
    run_cli,
    write_dict_rows,
)

# gpt-4o-mini's list price, USD per million tokens (OpenAI's pricing page).
MINI_INPUT, MINI_OUTPUT = 0.15, 0.60
ESTIMATE = re.compile(
    r"(\w+): (\d+) rows to do, (\d+) calls, ~([\d,]+) tokens in \+ ~([\d,]+) out, (\S+)"
)


def estimates(output: str) -> dict[str, dict[str, Any]]:
    """The --dry-run lines, by stage."""
    found = {}
    for stage, rows, calls, tokens_in, tokens_out, cost in ESTIMATE.findall(output):
        found[stage] = {
            "rows": int(rows),
            "calls": int(calls),
            "input": int(tokens_in.replace(",", "")),
            "tokens": int(tokens_in.replace(",", "")) + int(tokens_out.replace(",", "")),
            "cost": cost,
        }
    return found


def manifest(run: Path) -> dict[str, Any]:
    """The run folder's manifest."""
    data: dict[str, Any] = json.loads((run / "manifest.json").read_text())
    return data


def billed(record: dict[str, Any]) -> int:
    """Tokens a stage's calls were billed, both ways."""
    return int(record["tokens_billed"]["prompt"]) + int(record["tokens_billed"]["completion"])


def test_generate_dry_run_calls_nothing_and_its_estimate_holds(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.count_tokens = gpt_like_tokens
    chunks = docs(60)
    chunks[45].page_content = "   "  # an empty chunk is an error row, made without a call
    store = build_store(tmp_path / "store", chunks)
    first = run_cli("generate", "--chroma", str(store), "--out", "run", "--limit", "20")
    assert first.exit_code == 0, first.output
    before = env.count()
    dry = run_cli("generate", "--chroma", str(store), "--out", "run", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert env.count() == before  # not one chat call
    guess = estimates(dry.output)["generate"]
    assert (guess["rows"], guess["calls"]) == (40, 39)  # 60 - 20 done; one of them empty
    assert guess["cost"].startswith("$")
    real = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert real.exit_code == 0, real.output
    assert env.count() - before == guess["calls"]
    tokens = billed(manifest(tmp_path / "run")["stages"]["generate"])
    assert abs(guess["tokens"] - tokens) <= 0.15 * tokens, (guess["tokens"], tokens)


def test_judge_dry_run_counts_samples_and_controls_exactly(env: FakeOpenAI, tmp_path: Path) -> None:
    env.count_tokens = gpt_like_tokens
    exam(tmp_path / "run", 30)
    grade = ("judge", "--out", "run", "--samples", "3")
    fresh = run_cli(*grade, "--controls", "2", "--dry-run")
    assert fresh.exit_code == 0, fresh.output
    first = estimates(fresh.output)
    assert (first["judge"]["rows"], first["judge"]["calls"]) == (30, 90)
    # 2 questions x 8 kinds (4 known answers, 4 injections; several documents: each has a
    # donor) x 3 samples
    assert (first["judge_controls"]["rows"], first["judge_controls"]["calls"]) == (16, 48)
    assert run_cli(*grade, "--limit", "6", "--controls", "0").exit_code == 0
    assert env.count() == 18
    prompt_tokens = manifest(tmp_path / "run")["stages"]["judge"]["tokens_billed"]["prompt"]
    # Before any grade exists the output is a default guess; the input is estimated.
    assert abs(first["judge"]["input"] / 90 - prompt_tokens / 18) <= 0.15 * prompt_tokens / 18
    dry = run_cli(*grade, "--controls", "2", "--dry-run")
    assert env.count() == 18  # not one chat call
    guess = estimates(dry.output)
    assert (guess["judge"]["rows"], guess["judge"]["calls"]) == (24, 72)
    assert guess["judge_controls"]["calls"] == 48
    assert run_cli(*grade, "--controls", "2").exit_code == 0
    assert env.count() == 18 + 72 + 48
    tokens = billed(manifest(tmp_path / "run")["stages"]["judge"])
    assert abs(guess["judge"]["tokens"] - tokens) <= 0.15 * tokens, (guess["judge"], tokens)


def test_run_dry_run_estimates_every_stage_with_samples_and_controls(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(12))
    args = ("run", "--chroma", str(store), "--out", "run", "--samples", "2", "--control-runs")
    dry = run_cli(*args, "--embedding", "openai:e", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert env.count() == 0 and env.count("/embeddings") == 0
    found = {stage: figures["calls"] for stage, figures in estimates(dry.output).items()}
    # 12 chunks: 12 questions and answers, each graded twice; the judge's known-answer
    # controls: 10 questions (the default) x 8 kinds x 2 samples; then the gold and
    # closed-book control runs answer and grade the 12 questions again (no known answers).
    assert found == {
        "generate": 12,
        "answer": 12,
        "judge": 24,
        "judge_controls": 160,
        "answer_gold": 12,
        "judge_gold": 24,
        "answer_closed_book": 12,
        "judge_closed_book": 24,
    }
    assert "total: 280 calls" in dry.output
    assert not (tmp_path / "run" / "qa_dataset.csv").exists()


def test_run_dry_run_counts_the_controls_of_a_one_document_exam_as_the_run_makes_them(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # the stand-in ground truths were all one text: no question could pad another's answer,
    # and 2 controls of 8 were counted per question (12 where the run made 48)
    env.embedding_dim = 16
    chunks = [Document(f"Fact {i}: widget {i} weighs {i} grams.", metadata={"source": "a.md"})
              for i in range(6)]  # fmt: skip
    store = build_store(tmp_path / "store", chunks)
    args = ("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    dry = run_cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    estimated = estimates(dry.output)["judge_controls"]["calls"]
    assert run_cli(*args).exit_code == 0
    made = manifest(tmp_path / "run")["stages"]["judge_controls"]["calls"]
    assert estimated == made == 6 * 8


def test_a_known_model_costs_dollars_in_the_manifest_and_on_screen(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(10))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--model", "gpt-4o-mini")
    assert result.exit_code == 0, result.output
    record = manifest(tmp_path / "run")["stages"]["generate"]
    tokens = record["tokens_billed"]
    expected = (tokens["prompt"] * MINI_INPUT + tokens["completion"] * MINI_OUTPUT) / 1e6
    assert tokens["prompt"] > 0 and record["cost_usd"] == pytest.approx(expected)
    assert manifest(tmp_path / "run")["cost_usd"] == pytest.approx(expected)
    assert f"cost: ${expected:.4f}" in result.output


def test_an_unknown_model_is_unknown_and_the_overrides_price_it(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(10))
    args = ("generate", "--chroma", str(store), "--model", "my-local-llama", "--out")
    unknown = run_cli(*args, "run")
    assert unknown.exit_code == 0, unknown.output
    assert "cost: unknown" in unknown.output and "$0" not in unknown.output
    assert manifest(tmp_path / "run")["stages"]["generate"]["cost_usd"] is None
    assert manifest(tmp_path / "run")["cost_usd"] is None
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "2")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "8")
    priced = run_cli(*args, "priced")
    assert priced.exit_code == 0, priced.output
    record = manifest(tmp_path / "priced")["stages"]["generate"]
    tokens = record["tokens_billed"]
    expected = (tokens["prompt"] * 2 + tokens["completion"] * 8) / 1e6
    assert tokens["prompt"] > 0 and record["cost_usd"] == pytest.approx(expected)


def priced_store(env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of 8 chunks with ids, at $1 and $4 per million tokens in and out."""
    env.embedding_dim = 16
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "1")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "4")
    return build_store(tmp_path / "store", [Document(d.page_content, id=d.id) for d in docs(8)])


def test_run_records_each_stage_cost_and_the_total(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = priced_store(env, tmp_path, monkeypatch)
    args = ("--chroma", str(store), "--out", "run", "--embedding", "openai:embedder")
    result = run_cli("run", *args, "--model", "my-local-llama")
    assert result.exit_code == 0, result.output
    stages = manifest(tmp_path / "run")["stages"]
    costs = []
    for name in ("generate", "answer", "judge", "judge_controls"):
        record = stages[name]
        expected = (record["prompt_tokens"] + 4 * record["completion_tokens"]) / 1e6
        assert record["cost_usd"] == pytest.approx(expected) and expected > 0
        costs.append(expected)
    assert manifest(tmp_path / "run")["cost_usd"] == pytest.approx(sum(costs))
    assert "run cost: $" in result.output


def test_the_folders_total_adds_up_every_run_and_a_rerun_with_nothing_to_do_keeps_it(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each run's record covered itself: after a resume the total was the resumed part's
    # cost, and a rerun that found nothing to do made it $0
    store = priced_store(env, tmp_path, monkeypatch)
    args = ("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:embedder")
    args += ("--model", "my-local-llama", "--controls", "1")
    paid = []  # what each run's calls cost, stage by stage, from the test server's records

    def run(*more: str) -> dict[str, Any]:
        before = len(env.requests)
        result = run_cli(*args, *more)
        assert result.exit_code == 0, result.output
        chats = [r for r in env.requests[before:] if r.path.endswith("/chat/completions")]
        usage = [r.usage for r in chats if r.usage is not None]
        paid.append(sum(u["prompt_tokens"] + 4 * u["completion_tokens"] for u in usage) / 1e6)
        return manifest(tmp_path / "run")

    run("--limit", "3")
    run()  # the resumed rest
    whole = run()  # nothing to do
    assert paid[0] > 0 and paid[1] > 0 and paid[2] == 0
    assert whole["cost_usd"] == pytest.approx(paid[0] + paid[1])
    for record in whole["stages"].values():  # each stage: this run's cost, and every run's
        assert record["cost_usd"] == 0 and record["spent_usd"] > 0


@pytest.mark.parametrize("how", ["exam", "control-runs", "rag"])
def test_a_run_dry_run_counts_the_rows_a_real_run_still_does(
    env: FakeOpenAI, tmp_path: Path, how: str
) -> None:
    # After a run of 4 of 6 chunks, `run --dry-run` counted every grade again (each judged a
    # stand-in answer), and the controls' with them: "judge: 6 rows to do" where `run` did 2.
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(6))
    args = ("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    args += ("--controls", "2", *(("--control-runs",) if how == "control-runs" else ()))
    if how == "rag":  # a system that retrieves every chunk, by its text
        texts = [{"text": chunk.page_content} for chunk in docs(6)]
        rag = f"def answer(question):\n    return 'An answer.', {texts!r}\n"
        (tmp_path / "dry_rag.py").write_text(rag)
        args += ("--rag", "dry_rag:answer")
    control_runs = how == "control-runs"
    first = run_cli(*args, "--limit", "4")
    assert first.exit_code == 0, first.output
    dry = run_cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    guess = estimates(dry.output)
    before = env.count()
    real = run_cli(*args)
    assert real.exit_code == 0, real.output
    made = {}
    for folder, suffix in (("", ""), ("gold", "_gold"), ("closed_book", "_closed_book")):
        if (tmp_path / "run" / folder / "manifest.json").exists():
            stages = manifest(tmp_path / "run" / folder)["stages"]
            made |= {stage + suffix: record.get("calls", 0) for stage, record in stages.items()}
    assert {stage: made[stage] for stage in guess} == {s: f["calls"] for s, f in guess.items()}
    assert guess["judge"]["rows"] == 2 and len(guess) == (8 if control_runs else 4)
    assert sum(made[stage] for stage in guess) == env.count() - before
    again = run_cli(*args, "--dry-run")
    assert again.exit_code == 0, again.output
    assert {figures["calls"] for figures in estimates(again.output).values()} == {0}


def test_a_dry_run_counts_the_rows_whose_input_changed_as_a_real_run_redoes_them(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Two answers edited after they were graded: the dry run said "0 rows to do, $0", and
    # the real run then regraded both.
    exam(tmp_path / "run", 6)
    judge = ("judge", "--out", "run", "--controls", "0")
    assert run_cli(*judge).exit_code == 0
    answers = tmp_path / "run" / "answers.csv"
    rows = read_csv(answers)
    for row in rows[:2]:
        row["answer"] += " Edited since."
    write_dict_rows(answers, rows)
    dry = run_cli(*judge, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert estimates(dry.output)["judge"]["rows"] == 2
    before = env.count()
    real = run_cli(*judge)
    assert real.exit_code == 0 and env.count() - before == 2


def test_a_price_set_after_an_unpriced_run_says_why_the_total_stays_unknown(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the earlier run's calls cannot be priced now; the line advised setting the price that
    # was set
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", [Document(d.page_content, id=d.id) for d in docs(6)])
    args = ("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    args += ("--model", "my-local-llama", "--controls", "0")
    assert "set RAGEXAM_PRICE_INPUT/OUTPUT" in run_cli(*args, "--limit", "3").output
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "1")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "4")
    priced = run_cli(*args)
    said = " ".join(priced.output.split())
    assert priced.exit_code == 0 and "set RAGEXAM_PRICE_INPUT/OUTPUT" not in said
    assert "run cost: unknown: earlier runs of generate, answer, judge had no price" in said
    assert manifest(tmp_path / "run")["cost_usd"] is None  # a total is a total or nothing
