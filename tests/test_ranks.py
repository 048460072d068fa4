"""Every source chunk ranked: target_ranks in answer, and stats' metrics with R relevant chunks
held to trec_eval (through ir-measures) on random runs."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from pathlib import Path

import ir_measures
import pytest
from ir_measures import AP, RR, R, Success, nDCG
from support import exam_row, make_store, ranked_questions, read_csv, run_cli, write_dict_rows

from ragexam.analysis.questions import load_questions
from ragexam.analysis.ranking import COLUMNS
from ragexam.analysis.stats import question_states
from ragexam.io.csvfile import read_rows
from ragexam.io.fingerprint import text_hash
from ragexam.rag.base import Hit, ranks_of

# One document: a question on chunks c0 and c1, one on c2 alone, one the store cannot answer.
EXAM = [
    {"qa_id": "pair", "chunk_id": "c0", "kind": "multi-hop", "chunk_ids": '["c0", "c1"]'},
    {"qa_id": "one", "chunk_id": "c2", "kind": "single", "chunk_ids": '["c2"]'},
    {"qa_id": "none", "chunk_id": "", "kind": "unanswerable", "chunk_ids": "[]"},
]


def test_each_source_chunk_is_ranked_by_id_or_identical_text_and_counted_once() -> None:
    hits = [Hit("x", "same"), Hit("c1", "other"), Hit("y", "same"), Hit("c0", "same")]
    assert ranks_of(["c0", "c1"], ["same", "other"], hits) == [1, 2]  # text first, then id
    assert ranks_of(["a", "b", "c"], ["same", "same", "same"], hits) == [1, 3, 4]
    assert ranks_of(["c1", "z"], [None, None], hits) == [2, None]
    assert ranks_of([], [], hits) == []


def test_sources_whose_ids_are_gone_are_found_by_the_exams_hash_of_their_texts() -> None:
    # A store built again: new ids, and the store no longer has the old ids' texts.
    hits = [Hit("new-1", "second chunk"), Hit("new-2", "unrelated"), Hit("new-3", "first chunk")]
    hashes = [text_hash("first chunk"), text_hash("second chunk")]
    assert ranks_of(["c0", "c1"], [None, None], hits, hashes) == [3, 1]
    assert ranks_of(["c0", "c1"], [None, None], hits) == [None, None]  # without them, misses
    assert ranks_of(["c0", "c1"], [None, None], hits, hashes[:1]) == [3, None]
    assert ranks_of(["c1"], [None], hits, [*hashes[1:], "more"]) == [1]  # a hand-made cell


def test_answer_ranks_every_source_chunk(env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store = make_store(tmp_path / "store", env)
    rows = [{**row, "document": "d", "question": f"Q {row['qa_id']}?"} for row in EXAM]
    rows = [{**row, "ground_truth_answer": "g", "status": "ok", "error": ""} for row in rows]
    write_dict_rows(tmp_path / "run" / "qa_dataset.csv", rows)
    # c1 comes first and c0 fourth for the pair; c2 is not among the 3 retrieved for "one".
    ranked_questions(
        env, {"Q pair?": [1, 5, 6, 0, 2], "Q one?": [7, 8, 9, 2], "Q none?": [3, 4, 5, 2]}
    )
    out = tmp_path / "run"
    result = run_cli("answer", "--chroma", str(store), "--out", str(out), "--k", "4")
    assert result.exit_code == 0, result.output
    answers = {row["qa_id"]: row for row in read_csv(out / "answers.csv")}
    assert json.loads(answers["pair"]["target_ranks"]) == [4, 1]
    assert answers["pair"]["target_rank"] == "1"  # the best of them
    assert json.loads(answers["one"]["target_ranks"]) == [4]
    assert json.loads(answers["none"]["target_ranks"]) == []
    assert answers["none"]["target_rank"] == ""


# -- stats against trec_eval ------------------------------------------------------------------

K = 10
DOCUMENTS = ("alpha.md", "beta.md", "gamma.md")
MEANS = {
    "hit_rate": "Success",
    "mrr": "RR",
    "map": "AP",
    "ndcg": "nDCG",
    "precision": "P",
    "recall": "R",
    "f1": "F1",
    "all_found": "all",
}
AT = {"hit_rate": "Success", "mrr": "RR", "ndcg": "nDCG", "recall": "R"}


def random_run(folder: Path, rng: random.Random, questions: int) -> dict[str, dict[str, object]]:
    """A run of random questions with 1 to 3 relevant chunks, some found within K, plus a few
    unanswerable ones and error rows; returns each scored question's document, chunks, list."""
    qa, answers, judgments, scored = [], [], [], {}
    for number in range(questions):
        qa_id, document = f"q{number}", rng.choice(DOCUMENTS)
        relevant = [f"{qa_id}-s{i}" for i in range(rng.randint(1, 3))]
        unanswerable = rng.random() < 0.1
        chunks = [] if unanswerable else relevant
        retrieved = [f"{qa_id}-x{i}" for i in range(K)]
        ranks: list[int | None] = []
        for chunk in chunks:
            place = rng.choice([None, *range(1, K + 1)])
            if place is not None and retrieved[place - 1].startswith(f"{qa_id}-x"):
                retrieved[place - 1] = chunk
                ranks.append(place)
            else:
                ranks.append(None)
        kind = "unanswerable" if unanswerable else "single" if len(chunks) == 1 else "multi-hop"
        qa.append(exam_row(qa_id, document, kind, chunks, f"Q{number}?"))
        failed = rng.random() < 0.05
        found = [rank for rank in ranks if rank is not None]
        answers.append(
            {
                "qa_id": qa_id,
                "answer": "" if failed else "A",
                "retrieved_ids": "" if failed else json.dumps(retrieved),
                "target_rank": "" if failed or not found else min(found),
                "target_ranks": "" if failed else json.dumps(ranks),
                "status": "error" if failed else "ok",
                "error": "timeout" if failed else "",
            }
        )
        judgments.append({"qa_id": qa_id, "completeness": 1, "conciseness": 1, "status": "ok"})
        if not failed and not unanswerable:
            scored[qa_id] = {"document": document, "relevant": chunks, "retrieved": retrieved}
    write_dict_rows(folder / "qa_dataset.csv", qa)
    write_dict_rows(folder / "answers.csv", answers)
    write_dict_rows(folder / "judgments.csv", [{**row, "error": ""} for row in judgments])
    return scored


def trec_eval(scored: dict[str, dict[str, object]], cutoff: int) -> dict[str, dict[str, float]]:
    """Per question, trec_eval's measures at `cutoff`, with F1 and all_found from P and R."""
    qrels = [
        ir_measures.Qrel(qa_id, chunk, 1)
        for qa_id, question in scored.items()
        for chunk in question["relevant"]  # type: ignore[attr-defined]
    ]
    run = [
        ir_measures.ScoredDoc(qa_id, chunk, 100.0 - place)
        for qa_id, question in scored.items()
        for place, chunk in enumerate(question["retrieved"])  # type: ignore[arg-type]
    ]
    cut = [doc for doc in run if 100.0 - doc.score < cutoff]
    measures = [Success @ cutoff, AP @ cutoff, nDCG @ cutoff, ir_measures.P @ cutoff, R @ cutoff]
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for metric in ir_measures.pytrec_eval.iter_calc(measures, qrels, run):
        values[metric.query_id][str(metric.measure.NAME)] = metric.value
    # trec_eval's recip_rank has no cutoff: RR@C is recip_rank over the run cut at C.
    for metric in ir_measures.pytrec_eval.iter_calc([RR], qrels, cut):
        values[metric.query_id]["RR"] = metric.value
    for measured in values.values():
        p, r = measured["P"], measured["R"]
        measured["F1"] = 0.0 if p + r == 0 else 2 * p * r / (p + r)
        measured["all"] = float(math.isclose(r, 1.0))
    return values


def means(scored: dict[str, dict[str, object]], values: dict[str, dict[str, float]], name: str):  # type: ignore[no-untyped-def]
    """Each document's mean of a measure, and the overall one (ALL)."""
    by_document: dict[str, list[float]] = defaultdict(list)
    for qa_id, question in scored.items():
        by_document[str(question["document"])].append(values[qa_id][name])
        by_document["ALL"].append(values[qa_id][name])
    return {document: sum(found) / len(found) for document, found in by_document.items()}


@pytest.mark.parametrize("k", [K, 5])
def test_stats_matches_trec_eval_with_one_to_three_relevant_chunks(tmp_path: Path, k: int) -> None:
    scored = random_run(tmp_path, random.Random(2020 + k), 300)
    assert {len(q["relevant"]) for q in scored.values()} == {1, 2, 3}  # type: ignore[arg-type]
    result = run_cli("stats", "--out", str(tmp_path), "--k", str(k))
    assert result.exit_code == 0, result.output
    summaries = read_rows(tmp_path / "summary_by_document.csv", ["document"])
    summaries += read_rows(tmp_path / "summary.csv", ["document"])
    rows = {row["document"]: row for row in summaries}
    checked = 0
    at_k = trec_eval(scored, k)
    for column, name in MEANS.items():
        for document, expected in means(scored, at_k, name).items():
            assert float(rows[document][column]) == pytest.approx(expected, abs=1e-9), column
            checked += 1
    for cutoff in (c for c in (1, 3, 5, 10) if c <= k):
        at_cutoff = trec_eval(scored, cutoff)
        for column, name in AT.items():
            for document, expected in means(scored, at_cutoff, name).items():
                value = float(rows[document][f"{column}_at_{cutoff}"])
                assert value == pytest.approx(expected, abs=1e-9), (column, cutoff)
                checked += 1
    # Four rows (three documents and ALL): 8 means, and 4 metrics at each cutoff up to k.
    cutoffs = [c for c in (1, 3, 5, 10) if c <= k]
    assert checked == 4 * (8 + 4 * len(cutoffs))
    checked += per_question(tmp_path, scored, k, cutoffs)
    print(f"\nk={k}: {checked} values held to trec_eval over {len(scored)} questions")


def per_question(
    folder: Path, scored: dict[str, dict[str, object]], k: int, cutoffs: list[int]
) -> int:
    """Each question's scores as stats counts them (its state's row) against trec_eval's."""
    questions = load_questions(folder)
    states = question_states(questions, k)
    checked = 0
    for cutoff in [k, *cutoffs]:
        table, values = states.table(cutoff), trec_eval(scored, cutoff)
        for row, qa_id in enumerate(questions["qa_id"]):
            if qa_id not in scored:
                continue
            ours = dict(zip(COLUMNS, table[states.index[row]], strict=True))
            for column, name in zip(COLUMNS, MEANS.values(), strict=True):
                assert ours[column] == pytest.approx(values[qa_id][name], abs=1e-9), qa_id
                checked += 1
    assert checked == len(scored) * 8 * (1 + len(cutoffs))
    return checked
