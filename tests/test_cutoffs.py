"""Metrics at cutoffs 1, 3, 5 and 10 from one run: hand-worked values and trec_eval's."""

from __future__ import annotations

import math
import random
from pathlib import Path

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, R, Success, nDCG
from support import ANSWER_HEADER, JUDGE_HEADER, QA_HEADER, run_cli, write_csv

from ragexam.analysis.cutoffs import cutoff_columns, cutoffs_for
from ragexam.analysis.ranking import rank_states
from ragexam.io.csvfile import read_rows

# One document's answered questions: source chunk at ranks 1, 2, 4 and 7, and one miss.
RANKS = [1, 2, 4, 7, None]
D2, D4, D7 = 1 / math.log2(3), 1 / math.log2(5), 1 / math.log2(8)  # nDCG of ranks 2, 4, 7
HAND = {
    "hit_rate": {1: 1 / 5, 3: 2 / 5, 5: 3 / 5, 10: 4 / 5},
    "mrr": {1: 1 / 5, 3: 1.5 / 5, 5: 1.75 / 5, 10: (1.75 + 1 / 7) / 5},
    "ndcg": {1: 1 / 5, 3: (1 + D2) / 5, 5: (1 + D2 + D4) / 5, 10: (1 + D2 + D4 + D7) / 5},
    "recall": {1: 1 / 5, 3: 2 / 5, 5: 3 / 5, 10: 4 / 5},  # one relevant chunk: recall is hit
}


def test_cutoffs_stop_at_k() -> None:
    assert cutoffs_for(1) == [1]
    assert cutoffs_for(4) == [1, 3]
    assert cutoffs_for(5) == [1, 3, 5]
    assert cutoffs_for(20) == [1, 3, 5, 10]


def test_cutoff_columns_match_hand_worked_values() -> None:
    best = np.array([rank or np.nan for rank in RANKS] + [3, np.nan], dtype=np.float64)
    groups = np.array([0] * 5 + [1, 1], dtype=np.int64)  # group 1: rank 3 and a miss
    states = rank_states(best, np.ones(7, dtype=np.int64), [None] * 7, 10)
    columns = cutoff_columns(groups, states.index, states, 2)
    assert len(columns) == 16
    for metric, by_cutoff in HAND.items():
        for cutoff, value in by_cutoff.items():
            assert columns[f"{metric}_at_{cutoff}"][0] == pytest.approx(value, abs=1e-12)
    assert columns["hit_rate_at_1"][1] == 0.0 and columns["hit_rate_at_3"][1] == 0.5
    assert columns["mrr_at_10"][1] == pytest.approx(1 / 6) and columns["ndcg_at_5"][1] == 0.25


def crafted(folder: Path, ranks: dict[str, int | None]) -> Path:
    """A run whose questions of document A have the given ranks; every one judged."""
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(
        folder / "qa_dataset.csv",
        QA_HEADER,
        [[q, f"c-{q}", "A", f"Q {q}?", "T", "ok", ""] for q in ranks],
    )
    answers = [[q, "a", "[]", "" if r is None else r, "ok", ""] for q, r in ranks.items()]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers)
    write_csv(folder / "judgments.csv", JUDGE_HEADER, [[q, 1.0, 1.0, "ok", ""] for q in ranks])
    return folder


def test_stats_writes_every_metric_at_every_cutoff_up_to_k(tmp_path: Path) -> None:
    run = crafted(tmp_path / "run", {f"q{i}": rank for i, rank in enumerate(RANKS)})
    result = run_cli("stats", "--out", str(run), "--k", "10")
    assert result.exit_code == 0, result.output
    (overall,) = read_rows(run / "summary.csv", ["document"])
    for metric, by_cutoff in HAND.items():
        for cutoff, value in by_cutoff.items():
            assert float(overall[f"{metric}_at_{cutoff}"]) == pytest.approx(value, abs=1e-12)
    report = (run / "report.html").read_text()
    assert "Hit rate and MRR against the cutoff" in report
    assert "<title>hit_rate at 3: 0.400</title>" in report
    assert "<title>mrr at 10: 0.379</title>" in report  # (1.75 + 1/7) / 5 = 0.3786
    assert run_cli("stats", "--out", str(run), "--k", "3").exit_code == 0
    (overall,) = read_rows(run / "summary.csv", ["document"])
    assert "mrr_at_3" in overall and "mrr_at_5" not in overall and "hit_rate_at_10" not in overall
    # Cut at 3, the ranks 4 and 7 are misses: stats at k=3 agrees with the k=10 run cut at 3.
    assert float(overall["mrr_at_3"]) == pytest.approx(HAND["mrr"][3])
    assert float(overall["hit_rate"]) == pytest.approx(HAND["hit_rate"][3])


def test_cutoffs_match_trec_eval(tmp_path: Path) -> None:
    rng = random.Random(7)
    ranks = {f"q{i}": rng.choice([None, *range(1, 11)]) for i in range(60)}
    run = crafted(tmp_path / "run", ranks)
    assert run_cli("stats", "--out", str(run), "--k", "10").exit_code == 0
    (overall,) = read_rows(run / "summary.csv", ["document"])
    qrels = [ir_measures.Qrel(q, "source", 1) for q in ranks]
    for cutoff in (1, 3, 5, 10):
        # Ten retrieved chunks per question, the source at its rank; the run cut at C for RR,
        # since trec_eval's recip_rank has no cutoff.
        run_docs = [
            ir_measures.ScoredDoc(q, "source" if place == rank else f"x{place}", 100.0 - place)
            for q, rank in ranks.items()
            for place in range(1, 11)
        ]
        cut = [doc for doc in run_docs if 100.0 - doc.score <= cutoff]
        measures = ir_measures.calc_aggregate(
            [Success @ cutoff, nDCG @ cutoff, R @ cutoff], qrels, run_docs
        )
        measures.update(ir_measures.calc_aggregate([RR], qrels, cut))
        theirs = {
            "hit_rate": measures[Success @ cutoff],
            "ndcg": measures[nDCG @ cutoff],
            "recall": measures[R @ cutoff],
            "mrr": measures[RR],
        }
        for metric, value in theirs.items():
            assert float(overall[f"{metric}_at_{cutoff}"]) == pytest.approx(value, abs=1e-9)
