"""How often the judge's samples agree per key point: percent agreement and Fleiss' kappa, by
hand and through the CLI, where a noisy judge shows low agreement and a steady one full."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from judges import noisy, truthful
from openai_server import FakeOpenAI
from support import marked_exam, read_csv, run_cli

from ragexam.analysis.agreement import fleiss_kappa, grouped_agreement, kappa_interval

# Four key points rated three times each, by category (present, partial, absent):
# all present; two present and one absent; all absent; one of each.
FOUR = [[3, 0, 0], [2, 0, 1], [0, 0, 3], [1, 1, 1]]
# Agreeing pairs per point: 1, (4 + 1 - 3) / 6 = 1/3, 1, 0 -> mean 7/12.
# Categories: 6, 1 and 5 of 12 ratings -> chance (36 + 1 + 25) / 144 = 31/72.
# kappa = (7/12 - 31/72) / (1 - 31/72) = (11/72) / (41/72) = 11/41.
# Uneven: one point rated present and absent (P = 0), one rated once (left out), one rated
# present three times (P = 1): mean 1/2; categories 4 and 1 of 5 -> chance 17/25;
# kappa = (1/2 - 17/25) / (8/25) = -9/16.
UNEVEN = [[1, 0, 1], [1, 0, 0], [3, 0, 0]]


def test_fleiss_kappa_and_percent_agreement_match_the_hand_count() -> None:
    four = fleiss_kappa(np.array(FOUR))
    assert four.items == 4
    assert four.percent == pytest.approx(7 / 12) and four.kappa == pytest.approx(11 / 41)
    uneven = fleiss_kappa(np.array(UNEVEN))
    assert uneven.items == 2
    assert uneven.percent == pytest.approx(1 / 2) and uneven.kappa == pytest.approx(-9 / 16)
    steady = fleiss_kappa(np.array([[3, 0, 0], [0, 0, 3], [0, 3, 0]]))
    assert steady.percent == 1.0 and steady.kappa == pytest.approx(1.0)
    one_kind = fleiss_kappa(np.array([[2, 0, 0], [2, 0, 0]]))
    assert one_kind.percent == 1.0 and one_kind.kappa is None  # chance agreement is 1


def test_grouped_agreement_is_each_groups_own() -> None:
    counts = np.array([*FOUR, *UNEVEN])
    groups = np.array([0] * 4 + [1] * 3)
    percent, kappa = grouped_agreement(groups, counts, 3)
    assert percent[:2] == pytest.approx([7 / 12, 1 / 2])
    assert kappa[:2] == pytest.approx([11 / 41, -9 / 16])
    assert np.isnan(percent[2]) and np.isnan(kappa[2])  # a group without key points


def test_the_kappa_interval_is_seeded_and_holds_the_estimate() -> None:
    counts = np.random.default_rng(5).multinomial(3, [0.6, 0.1, 0.3], size=200)
    estimate = fleiss_kappa(counts).kappa
    assert estimate is not None
    low, high = kappa_interval(counts, seed=1)
    assert (low, high) == kappa_interval(counts, seed=1) != kappa_interval(counts, seed=2)
    assert low < estimate < high and 0 < high - low < 0.3
    steady = np.array([[3, 0, 0], [0, 0, 3]] * 10)
    assert kappa_interval(steady) == (1.0, 1.0)
    assert all(np.isnan(kappa_interval(np.array([[2, 0, 0]] * 5))))  # kappa undefined


def exam(run: Path, n: int) -> None:
    """n questions over three documents, three key points each; answers hold two of them."""
    rows = [
        {
            "qa_id": f"q{i}",
            "document": f"doc{i % 3}",
            "question": f"Question {i}?",
            "truth": f"red{i} green{i} blue{i}.",
            "answer": f"red{i} green{i}.",
            "key_points": [f"red{i}", f"green{i}", f"blue{i}"],
        }
        for i in range(n)
    ]
    marked_exam(run, rows)


def test_a_noisy_judge_shows_low_agreement_and_a_steady_one_full(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "noisy", 30)
    env.responder = noisy()
    result = run_cli("judge", "--out", "noisy", "--samples", "5", "--controls", "0")
    assert result.exit_code == 0, result.output
    assert env.count() == 150
    row = read_csv(tmp_path / "noisy" / "judgments.csv")[0]
    samples = json.loads(row["key_point_samples"])
    assert len(samples) == 5 and all(len(verdicts) == 3 for verdicts in samples)
    stats = run_cli("stats", "--out", "noisy")
    assert stats.exit_code == 0, stats.output
    (overall,) = read_csv(tmp_path / "noisy" / "summary.csv")
    # verdicts drawn at random from three: pairs agree a third of the time, kappa near 0
    assert float(overall["key_point_agreement"]) < 0.5
    assert abs(float(overall["key_point_kappa"])) < 0.15
    by_document = read_csv(tmp_path / "noisy" / "summary_by_document.csv")
    assert len(by_document) == 3 and all(float(r["key_point_kappa"]) < 0.3 for r in by_document)
    assert "samples agree on" in stats.output and "Fleiss' kappa" in stats.output
    low, high = float(overall["key_point_kappa_ci_low"]), float(overall["key_point_kappa_ci_high"])
    assert low < float(overall["key_point_kappa"]) < high
    assert "Fleiss&#x27; kappa" in (tmp_path / "noisy" / "report.html").read_text()

    exam(tmp_path / "steady", 30)
    env.responder = truthful
    steady = run_cli("judge", "--out", "steady", "--samples", "3", "--controls", "0")
    assert steady.exit_code == 0, steady.output
    assert run_cli("stats", "--out", "steady").exit_code == 0
    (overall,) = read_csv(tmp_path / "steady" / "summary.csv")
    assert float(overall["key_point_agreement"]) == 1.0
    assert float(overall["key_point_kappa"]) == pytest.approx(1.0)
    assert float(overall["key_point_recall"]) == pytest.approx(2 / 3)


def test_with_samples_the_marked_script_shows_each_grading_beside_the_majority(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # The report showed the majority marks beside grades that are the means of the samples:
    # a person recounting the marks got another grade
    exam(tmp_path / "run", 3)
    env.responder = noisy()
    assert run_cli("judge", "--out", "run", "--samples", "3", "--controls", "0").exit_code == 0
    assert run_cli("stats", "--out", "run").exit_code == 0
    page = (tmp_path / "run" / "report.html").read_text()
    assert page.count("graded 3 times: a point's mark is its majority") >= 3  # each answer
    signs = {"present": "\u2713", "partial": "\u00bd", "absent": "\u2717"}
    for row in read_csv(tmp_path / "run" / "judgments.csv"):
        samples = json.loads(row["key_point_samples"])
        for at in range(3):  # every point's three marks, in the order graded
            marks = " ".join(signs[one[at]] for one in samples)
            assert f"<small>gradings: {marks}</small>" in page
