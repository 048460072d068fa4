"""Control runs in a world whose right answers are known: gold context, closed book, diagnosis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from support import build_store, docs, read_csv, run_cli, write_dict_rows, write_qa
from world import World

from ragexam.analysis.controlruns import measured_diagnosis
from ragexam.io.csvfile import read_rows


def run_world(env: FakeOpenAI, tmp_path: Path, world: World, *extra: str) -> Path:
    """`ragexam run --controls` over the world's store; the run folder."""
    env.responder, env.embed = world.respond, world.embed
    store = world.build_store(tmp_path / "store")
    result = run_cli(
        "run", "--chroma", str(store), "--out", "run", "--controls",
        "--embedding", "openai:fake-embed", "--k", "3", *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "completeness: gold context " in result.output and "retrieval loss" in result.output
    return tmp_path / "run"


def summary(run: Path) -> dict[str, dict[str, str]]:
    """Both summaries by document, ALL included."""
    rows = read_rows(run / "summary_by_document.csv", ["document"])
    rows += read_rows(run / "summary.csv", ["document"])
    return {row["document"]: row for row in rows}


def test_gold_and_closed_book_bracket_the_rag_run_and_measure_retrieval_loss(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World({"found.md": 6, "missed.md": 4}, missed={"missed.md"})
    run = run_world(env, tmp_path, world)
    gold = read_csv(run / "gold" / "answers.csv")
    closed = read_csv(run / "closed_book" / "answers.csv")
    assert len(gold) == len(closed) == 10
    assert {row["context"] for row in gold} == {"gold"}
    assert {row["context"] for row in closed} == {"none"}
    assert (run / "gold" / "manifest.json").exists() and (
        run / "closed_book" / "judgments.csv"
    ).exists()
    rows = summary(run)
    # found.md: every source chunk retrieved at rank 1, so the RAG answers are complete;
    # missed.md: never retrieved, so "not in the context": 0. Overall 6 of 10 questions.
    expected_rag = {"found.md": 1.0, "missed.md": 0.0, "ALL": 0.6}
    for document, rag in expected_rag.items():
        row = rows[document]
        assert float(row["completeness_gold"]) >= 0.95
        assert float(row["completeness_closed_book"]) <= 0.05
        assert float(row["completeness_mean"]) == pytest.approx(rag)
        loss = float(row["completeness_gold"]) - float(row["completeness_mean"])
        assert float(row["retrieval_loss"]) == pytest.approx(loss)
        assert float(row["retrieval_loss"]) == pytest.approx(1.0 - rag)
    assert rows["missed.md"]["diagnosis"] == "retrieval"
    assert rows["found.md"]["diagnosis"] == "ok"
    report = (run / "report.html").read_text()
    assert "Is it retrieval or generation? Measured" in report
    # three bars per document: gold, RAG, closed book (the closed-book ones have width 0)
    assert report.count("<title>gold context 1.000</title>") == 2
    assert report.count("<title>RAG 1.000</title>") == 1 and "<title>RAG 0.000</title>" in report
    assert report.count("<title>closed book 0.000</title>") == 2
    assert "retrieval · retrieval loss +1.00" in report
    # the legend says how the measured diagnosis reads (it gave only the thresholds')
    assert "With the control runs, the diagnosis is measured, first match wins" in report


def test_a_document_answered_closed_book_is_prior_knowledge(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World({"famous.md": 4, "found.md": 3, "missed.md": 3}, {"missed.md"}, {"famous.md"})
    rows = summary(run_world(env, tmp_path, world, "--sample", "9"))  # 3 of each document
    assert float(rows["famous.md"]["completeness_closed_book"]) == 1.0
    assert rows["famous.md"]["diagnosis"] == "prior_knowledge"
    assert {rows[name]["questions"] for name in ("famous.md", "found.md", "missed.md")} == {"3"}
    assert rows["missed.md"]["diagnosis"] == "retrieval"
    assert rows["found.md"]["diagnosis"] == "ok"
    assert float(rows["ALL"]["completeness_closed_book"]) == pytest.approx(3 / 9)


def test_resuming_with_another_context_or_k_is_refused_and_rag_cannot_take_a_context(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World({"found.md": 4})
    env.responder, env.embed = world.respond, world.embed
    store = str(world.build_store(tmp_path / "store"))
    assert run_cli("generate", "--chroma", store, "--out", "run").exit_code == 0
    common = ("answer", "--chroma", store, "--out", "run", "--embedding", "openai:fake-embed")
    assert run_cli(*common, "--k", "2").exit_code == 0
    calls = env.count()
    for extra, named in ((("--k", "3"), "k '2'"), (("--context", "gold"), "context 'retrieved'")):
        refused = run_cli(*common, "--k", "2", *extra)
        assert refused.exit_code == 2, refused.output
        assert named in refused.output and "--force" in refused.output
    other = run_cli(*common, "--k", "2", "--embedding", "openai:other-embed")
    assert other.exit_code == 2 and "embedding 'openai:fake-embed'" in other.output
    assert env.count() == calls  # refused before any call
    rag = run_cli("answer", "--out", "run", "--rag", "nowhere:rag", "--context", "none")
    assert rag.exit_code == 2
    assert rag.output.count("\n") == 1 and "cannot be handed a context" in rag.output
    closed = run_cli(
        "answer", "--out", "run/closed", "--qa-dataset", "run/qa_dataset.csv", "--context", "none"
    )
    assert closed.exit_code == 0, closed.output  # closed-book needs no store
    assert {row["answer"] for row in read_csv(tmp_path / "run" / "closed" / "answers.csv")} == {
        "I don't know."
    }


def test_controls_refuse_a_users_rag_system(env: FakeOpenAI, tmp_path: Path) -> None:
    refused = run_cli("run", "--chroma", "nowhere", "--rag", "my:rag", "--control-runs")
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert "without --rag" in refused.output and env.count() == 0


def test_measured_diagnosis_first_match_wins() -> None:
    # columns: closed-book, gold, RAG completeness, conciseness < 0.6, threshold diagnosis
    cases = [
        (0.6, 0.5, 0.1, True, "retrieval", "prior_knowledge"),  # closed book >= 0.6 first
        (0.1, 0.59, 0.1, True, "retrieval", "generation"),  # then gold < 0.6
        (0.1, 1.0, 0.8, True, "ok", "retrieval"),  # then a loss of 0.2 (1.0 - 0.8, in floats less)
        (0.1, 0.9, 0.71, True, "ok", "too much context"),  # loss 0.19: then conciseness
        (0.1, 0.9, 0.71, False, "retrieval", "ok"),
        (np.nan, 0.9, 0.7, False, "generation", "generation"),  # no closed-book figure
        (0.1, 0.9, np.nan, False, "not judged", "not judged"),
    ]
    closed, gold, rag, low, fallback, expected = (
        np.array(column) for column in zip(*cases, strict=True)
    )
    columns = {"completeness_gold": gold, "completeness_closed_book": closed}
    columns["retrieval_loss"] = gold - rag
    assert list(measured_diagnosis(columns, fallback, low)) == list(expected)
    assert list(measured_diagnosis({}, fallback, low)) == list(fallback)  # no control runs


def test_a_huge_gold_chunk_is_cut_in_the_prompt(env: FakeOpenAI, tmp_path: Path) -> None:
    chunks = docs(3)
    chunks[1].page_content = "START " + "word " * 200_000  # a 1 MB source chunk
    store = build_store(tmp_path / "store", chunks)
    write_qa(
        tmp_path / "run" / "qa_dataset.csv",
        [{"qa_id": "a", "chunk_id": "chunk-0001", "question": "q"}],
    )
    args = ["answer", "--chroma", str(store), "--out", "run", "--context", "gold"]
    result = run_cli(*args, "--max-chunk-chars", "300")
    assert result.exit_code == 0, result.output
    sent = str(env.requests[-1].body["messages"][-1]["content"])
    cut = "START " + "word " * 58 + "word"  # 6 + 58 * 5 + 4 = 300 characters
    assert f'<chunk rank="1">\n{cut}\n</chunk>' in sent
    assert len(sent) < 5000
    assert read_csv(tmp_path / "run" / "answers.csv")[0]["target_rank"] == "1"


def test_run_controls_answer_with_the_runs_own_options(env: FakeOpenAI, tmp_path: Path) -> None:
    texts = {f"c{i}": f"Chunk {i} says: " + f"fact {i} " * 40 for i in range(4)}
    chunks = [Document(text, metadata={"source": "a.md"}, id=cid) for cid, text in texts.items()]
    store = build_store(tmp_path / "store", chunks)
    env.embedding_dim = 16
    result = run_cli(
        "run", "--chroma", str(store), "--out", "run", "--control-runs", "--embedding", "openai:e",
        "--k", "2", "--max-chunk-chars", "120", "--no-texts", "--controls", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    gold = [json.dumps(r.body) for r in env.requests if "<chunk" in json.dumps(r.body)]
    assert len(gold) >= 4 + 4  # the RAG run's answers and the gold run's
    for body in gold:  # no chunk reached the answerer longer than --max-chunk-chars
        assert not any(json.dumps(text[:121])[1:-1] in body for text in texts.values())
    for folder in ("run", "run/gold", "run/closed_book"):
        header = (tmp_path / folder / "answers.csv").read_text(encoding="utf-8").splitlines()[0]
        assert "retrieved_texts" not in header and "source_text" not in header, folder
    said = result.output  # each control run's stages named as such, not a second "answer"
    assert "gold answer: 4 ok" in said and "closed-book judge: 4 ok" in said
    assert sum(line.startswith("answer: ") for line in said.splitlines()) == 1


def test_unanswerable_questions_stay_out_of_the_control_runs_figures(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Closed-book, "I don't know" is the right answer to an unanswerable question: counted in,
    # it made a document that retrieval never finds look answered from prior knowledge.
    world = World({"found.md": 3, "missed.md": 3}, missed={"missed.md"})
    rows = summary(run_world(env, tmp_path, world, "--unanswerable", "4"))
    kinds = {row["kind"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert kinds == {"single", "unanswerable"}
    for document in ("found.md", "missed.md", "ALL"):
        assert float(rows[document]["completeness_closed_book"]) <= 0.05, document
    assert rows["missed.md"]["diagnosis"] == "retrieval"
    assert rows["found.md"]["diagnosis"] == "ok"


def test_the_retrieval_loss_pairs_the_questions_graded_in_both_runs(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # gold's grades of 3 found.md questions ended in error: the loss took gold's mean over the
    # other 7 less the run's over all 10, two different sets of questions
    world = World({"found.md": 5, "missed.md": 5}, missed={"missed.md"})
    run = run_world(env, tmp_path, world)
    gold = run / "gold" / "judgments.csv"
    rows = read_csv(gold)
    exam = {row["qa_id"]: row["document"] for row in read_csv(run / "qa_dataset.csv")}
    spoiled = [row["qa_id"] for row in rows if exam[row["qa_id"]] == "found.md"][:3]
    for row in rows:
        if row["qa_id"] in spoiled:
            row.update(status="error", error="invalid JSON", completeness="", conciseness="")
    write_dict_rows(gold, rows)
    assert run_cli("stats", "--out", "run").exit_code == 0
    rag = {row["qa_id"]: float(row["completeness"]) for row in read_csv(run / "judgments.csv")}
    golden = {row["qa_id"]: float(row["completeness"]) for row in rows if row["completeness"]}
    paired = [golden[q] - rag[q] for q in golden]  # the 7 graded in both
    assert len(paired) == 7
    overall = summary(run)["ALL"]
    assert float(overall["retrieval_loss"]) == pytest.approx(sum(paired) / 7, abs=1e-9)


def test_the_runs_figure_beside_gold_is_its_own_over_the_same_questions(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # the run's own judge failed on 3 missed.md questions; gold graded them 0: the figure
    # shown as the run's (gold less the loss) mixed gold over 10 with a loss over 7 (0.41,
    # where the run's grades average 0.71)
    world = World({"found.md": 5, "missed.md": 5}, missed={"missed.md"})
    run = run_world(env, tmp_path, world)
    exam = {row["qa_id"]: row["document"] for row in read_csv(run / "qa_dataset.csv")}
    spoiled = [q for q, document in exam.items() if document == "missed.md"][:3]
    rows = read_csv(run / "judgments.csv")
    for row in rows:
        if row["qa_id"] in spoiled:
            row.update(status="error", error="invalid JSON", completeness="", conciseness="")
    write_dict_rows(run / "judgments.csv", rows)
    gold = read_csv(run / "gold" / "judgments.csv")
    for row in gold:
        if row["qa_id"] in spoiled:
            row["completeness"] = "0.0"
    write_dict_rows(run / "gold" / "judgments.csv", gold)
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0, stats.output
    graded = [float(row["completeness"]) for row in rows if row["completeness"]]
    golden = {row["qa_id"]: float(row["completeness"]) for row in gold}
    paired_gold = sum(golden[row["qa_id"]] for row in rows if row["completeness"]) / 7
    mean = sum(graded) / len(graded)
    said = " ".join(stats.output.split())
    assert f"gold context {paired_gold:.2f}, RAG {mean:.2f}," in said
    assert f"the retrieved chunks {mean:.0%})" in said
