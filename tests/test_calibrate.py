"""`ragexam calibrate` through the CLI: every figure is worked out by hand in the test."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from judges import truthful
from openai_server import FakeOpenAI
from support import run_cli

from ragexam.analysis.calibrate import agreement, quadratic_kappa, spearman_ci

# Question i's answer holds the first SAID[i] of its ground truth's 4 words, then EXTRA[i] others,
# so the truthful (word overlap) judge grades completeness SAID/4 and conciseness SAID/(SAID+EXTRA).
SAID = [0, 1, 2, 3, 4, 4, 2, 1]
EXTRA = [2, 3, 2, 1, 0, 4, 0, 1]
COMPLETENESS = [0, 0.25, 0.5, 0.75, 1, 1, 0.5, 0.25]
CONCISENESS = [0, 0.25, 0.5, 0.75, 1, 0.5, 1, 0.5]


def graded_run(run: Path, env: FakeOpenAI) -> Path:
    """Eight questions over four documents, judged by the truthful judge (no controls)."""
    run.mkdir(parents=True)
    truth = [[f"alpha{i}", f"beta{i}", f"gamma{i}", f"delta{i}"] for i in range(8)]
    with (run / "qa_dataset.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status"]
        )
        for i in range(8):
            writer.writerow(
                [f"q{i}", f"c{i}", f"doc{i % 4}", f"Question {i}?", " ".join(truth[i]), "ok"]
            )
    with (run / "answers.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["qa_id", "answer", "retrieved_ids", "target_rank", "status", "error"])
        for i in range(8):
            words = truth[i][: SAID[i]] + [f"other{i}x{j}" for j in range(EXTRA[i])]
            writer.writerow([f"q{i}", " ".join(words), "[]", "1", "ok", ""])
    env.responder = truthful
    result = run_cli("judge", "--out", str(run), "--controls", "0", "--max-error-rate", "0.2")
    assert result.exit_code == 0, result.output
    return run


def write_labels(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    """A person's labels file."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def calibration(run: Path) -> dict[str, dict[str, str]]:
    """calibration.csv by metric."""
    with (run / "calibration.csv").open(newline="") as handle:
        return {row["metric"]: row for row in csv.DictReader(handle)}


def figures(row: dict[str, str]) -> dict[str, float]:
    """The numbers of one calibration.csv row."""
    return {name: float(value) for name, value in row.items() if name != "metric"}


def test_labels_equal_to_the_truthful_grades_agree_fully(env: FakeOpenAI, tmp_path: Path) -> None:
    run = graded_run(tmp_path / "run", env)
    rows = [[f"q{i}", COMPLETENESS[i], CONCISENESS[i]] for i in range(8)]
    labels = write_labels(tmp_path / "labels.csv", ["qa_id", "completeness", "conciseness"], rows)
    result = run_cli("calibrate", str(labels), "--out", str(run))
    assert result.exit_code == 0, result.output
    table = calibration(run)
    assert list(table) == ["completeness", "conciseness"]
    for row in table.values():
        # identical grades: ranks and values agree exactly, in every resample too, no error
        assert figures(row) == pytest.approx(
            {
                "n": 8,
                "spearman": 1,
                "spearman_ci_low": 1,
                "spearman_ci_high": 1,
                "pearson": 1,
                "mae": 0,
                "bias": 0,
                "kappa": 1,
            }
        )
    assert (
        "the judge agrees well with you on completeness (rho 1.00 [1.00, 1.00], n 8) and "
        "conciseness (rho 1.00 [1.00, 1.00], n 8)" in result.output
    )
    stats = run_cli("stats", "--out", str(run))
    assert stats.exit_code == 0, stats.output
    page = (run / "report.html").read_text()
    assert "Does the judge agree with a person?" in page and "agrees well with you" in page


def test_inverse_labels_give_a_negative_rho(env: FakeOpenAI, tmp_path: Path) -> None:
    run = graded_run(tmp_path / "run", env)
    rows = [[f"q{i}", 1 - COMPLETENESS[i], 1 - CONCISENESS[i]] for i in range(8)]
    labels = write_labels(tmp_path / "labels.csv", ["qa_id", "completeness", "conciseness"], rows)
    result = run_cli("calibrate", str(labels), "--out", str(run))
    assert result.exit_code == 0, result.output
    table = calibration(run)
    # completeness: judge c, person 1 - c. |c - (1 - c)| = |2c - 1| = 1, .5, 0, .5, 1, 1, 0, .5
    # (sum 4.5); 2c - 1 = -1, -.5, 0, .5, 1, 1, 0, -.5 (sum 0.5). Bins 0,1,2,3,4,4,2,1 against
    # 4,3,2,1,0,0,2,3: squared distances 16+4+0+4+16+16+0+4 = 60; marginals [1,2,2,1,2] and
    # [2,1,2,2,1] give chance sum 242 / 8 = 30.25; kappa = 1 - 60 / 30.25 = -119/121.
    assert figures(table["completeness"]) == pytest.approx(
        {
            "n": 8,
            "spearman": -1,
            "spearman_ci_low": -1,
            "spearman_ci_high": -1,
            "pearson": -1,
            "mae": 4.5 / 8,
            "bias": 0.5 / 8,
            "kappa": -119 / 121,
        }
    )
    # conciseness: |2k - 1| = 1, .5, 0, .5, 1, 0, 1, 0 (sum 4); 2k - 1 sums to 1. Bins
    # 0,1,2,3,4,2,4,2 against 4,3,2,1,0,2,0,2: distances 16+4+0+4+16+0+16+0 = 56; marginals
    # [1,1,3,1,2] and [2,1,3,1,1] give chance sum 232 / 8 = 29; kappa = 1 - 56/29 = -27/29.
    assert figures(table["conciseness"]) == pytest.approx(
        {
            "n": 8,
            "spearman": -1,
            "spearman_ci_low": -1,
            "spearman_ci_high": -1,
            "pearson": -1,
            "mae": 4 / 8,
            "bias": 1 / 8,
            "kappa": -27 / 29,
        }
    )
    assert "the judge disagrees with you on completeness (rho -1.00" in result.output
    assert "and grades conciseness 0.12 higher than you do" in result.output


def test_the_figures_of_five_pairs_by_hand() -> None:
    judge = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    person = np.array([0.2, 0.1, 0.6, 0.9, 0.8])
    found = agreement("completeness", judge, person, seed=0)
    # ranks 1..5 against 2,1,3,5,4: d^2 sums to 4, rho = 1 - 6 * 4 / (5 * 24) = 0.8
    assert found.spearman == pytest.approx(0.8)
    # deviations -.4,-.2,0,.2,.4 and -.32,-.42,.08,.38,.28: cross 0.4, squares 0.4 and 0.508
    assert found.pearson == pytest.approx(0.4 / math.sqrt(0.4 * 0.508))
    assert found.mae == pytest.approx(0.7 / 5) and found.bias == pytest.approx(0.5 - 0.52)
    # bins 0,1,2,3,4 against 1,0,3,4,4: distances 1+1+1+1+0 = 4; person marginal [1,1,0,1,2]
    # against the judge's ones: chance (30 + 15 + 0 + 15 + 2 * 30) / 5 = 24; 1 - 4/24 = 5/6
    assert found.kappa == pytest.approx(5 / 6)
    assert -1 <= found.spearman_ci_low <= 0.8 <= found.spearman_ci_high <= 1
    assert spearman_ci(judge, person, seed=0) == spearman_ci(judge, person, seed=0)
    # 1.0 falls in the last bin: bins 4 and 0 on both sides agree fully
    assert quadratic_kappa(np.array([1.0, 0.0]), np.array([1.0, 0.0])) == 1
    assert math.isnan(quadratic_kappa(np.array([0.5, 0.5]), np.array([0.5, 0.5])))


def test_template_then_labels_round_trip(env: FakeOpenAI, tmp_path: Path) -> None:
    run = graded_run(tmp_path / "run", env)
    result = run_cli("calibrate", "--template", "4", "--out", str(run), "--seed", "5")
    assert result.exit_code == 0, result.output
    told = " ".join(result.output.split()).split("then run: ")[1]
    assert told == f"ragexam calibrate {run / 'labels_template.csv'} --out {run}"  # runs as said
    with (run / "labels_template.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    assert reader.fieldnames == [
        "qa_id",
        "document",
        "question",
        "ground_truth_answer",
        "answer",
        "completeness",
        "conciseness",
    ]
    assert sorted(row["document"] for row in rows) == ["doc0", "doc1", "doc2", "doc3"]
    for row in rows:
        i = int(row["qa_id"][1:])
        assert row["question"] == f"Question {i}?" and row["ground_truth_answer"].startswith(
            "alpha"
        )
        assert row["completeness"] == row["conciseness"] == ""
        row["completeness"] = str(COMPLETENESS[i] * 10)
    again = run_cli("calibrate", "--template", "4", "--out", str(run))
    assert again.exit_code != 0 and "move it away" in again.output
    labels = write_labels(
        tmp_path / "mine.csv",
        ["qa_id", "completeness"],
        [[r["qa_id"], r["completeness"]] for r in rows],
    )
    result = run_cli("calibrate", str(labels), "--out", str(run), "--scale", "ten")
    assert result.exit_code == 0, result.output
    (row,) = calibration(run).values()
    assert row["metric"] == "completeness" and float(row["n"]) == 4
    assert float(row["mae"]) == pytest.approx(0) and float(row["bias"]) == pytest.approx(0)
    assert "only 4 rows have a completeness label" in result.output


def bad(
    tmp_path: Path, env: FakeOpenAI, header: list[str], rows: list[list[object]], *args: str
) -> str:
    """Calibrate with these labels; the one line it fails with."""
    run = graded_run(tmp_path / "run", env)
    labels = write_labels(tmp_path / "labels.csv", header, rows)
    result = run_cli("calibrate", str(labels), "--out", str(run), *args)
    assert result.exit_code != 0
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {labels}")
    return line


def test_a_label_for_an_unknown_qa_id_names_the_line(env: FakeOpenAI, tmp_path: Path) -> None:
    line = bad(tmp_path, env, ["qa_id", "completeness"], [["q0", 0], ["q1", 0.5], ["zz", 1]])
    assert "line 4 (qa_id 'zz'): no judgment has this qa_id" in line
    assert "fix it or delete the row" in line


def test_a_non_numeric_label_names_the_line(env: FakeOpenAI, tmp_path: Path) -> None:
    line = bad(tmp_path, env, ["qa_id", "conciseness"], [["q0", 0], ["q1", "high"]])
    assert "line 3 (qa_id 'q1'): conciseness 'high' is not a number" in line
    assert "write 0 to 1 or leave it empty" in line


@pytest.mark.parametrize(
    ("value", "args", "hint"),
    [
        ("7", (), "pass --scale ten"),
        ("11", ("--scale", "ten"), "write 0 to 10"),
        ("-0.5", (), "write 0 to 1"),
    ],
)
def test_a_label_out_of_range_names_the_line_and_the_scale(
    env: FakeOpenAI, tmp_path: Path, value: str, args: tuple[str, ...], hint: str
) -> None:
    line = bad(tmp_path, env, ["qa_id", "completeness"], [["q2", value]], *args)
    assert f"line 2 (qa_id 'q2'): completeness '{value}' is out of range" in line and hint in line


def test_a_missing_labels_file_says_how_to_begin_one(env: FakeOpenAI, tmp_path: Path) -> None:
    run = graded_run(tmp_path / "run", env)
    result = run_cli("calibrate", str(tmp_path / "labels.csv"), "--out", str(run))
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "not found: grade some answers by hand in it first" in said
    assert "ragexam calibrate --template N" in said and "run the stage" not in said


def test_labels_of_stale_grades_are_left_out_and_said(env: FakeOpenAI, tmp_path: Path) -> None:
    # The answer of q0 was changed after judge graded it: its grade is of another answer.
    run = graded_run(tmp_path / "run", env)
    lines = (run / "answers.csv").read_text().splitlines()
    q0 = next(n for n, line in enumerate(lines) if line.startswith("q0,"))
    lines[q0] = 'q0,"An answer edited since.",[],1,ok,'
    (run / "answers.csv").write_text("\n".join(lines) + "\n")
    labels = write_labels(
        tmp_path / "labels.csv", ["qa_id", "completeness"], [[f"q{i}", 1.0] for i in range(8)]
    )
    result = run_cli("calibrate", str(labels), "--out", str(run))
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "1 labelled rows left out: their grade was made from a question, answer" in said
    assert calibration(run)["completeness"]["n"] == "7"


def test_labels_without_a_label_column(env: FakeOpenAI, tmp_path: Path) -> None:
    line = bad(tmp_path, env, ["qa_id", "grade"], [["q0", 1]])
    assert "has no label column: add completeness and/or conciseness" in line


def test_fewer_than_five_labels_warn_and_still_write_the_figures(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    run = graded_run(tmp_path / "run", env)
    rows = [["q1", 0.25], ["q2", 0.5], ["q3", ""], ["q4", 0.75]]  # q3 left empty: not labelled
    labels = write_labels(tmp_path / "labels.csv", ["qa_id", "completeness"], rows)
    result = run_cli("calibrate", str(labels), "--out", str(run))
    assert result.exit_code == 0, result.output
    warning = f"Warning: {labels}: only 3 rows have a completeness label; a rank correlation "
    assert warning + "means little below 5" in result.output
    # judge 0.25, 0.5, 1 (q4 said all four words) against 0.25, 0.5, 0.75: same order
    assert figures(calibration(run)["completeness"]) == pytest.approx(
        {
            "n": 3,
            "spearman": 1,
            "spearman_ci_low": 1,
            "spearman_ci_high": 1,
            # deviations -1/3, -1/12, 5/12 and -1/4, 0, 1/4: cross 3/16, squares 7/24 and 1/8
            "pearson": (3 / 16) / math.sqrt(7 / 24 * 1 / 8),
            "mae": 0.25 / 3,
            "bias": 0.25 / 3,
            # bins 1, 2, 4 against 1, 2, 3: distance 1; chance ((0+1+4) + (1+0+1) + (9+4+1)) / 3
            # = 7, so kappa = 1 - 1/7
            "kappa": 1 - 1 / 7,
        }
    )


def test_calibrate_needs_labels_or_a_template(env: FakeOpenAI, tmp_path: Path) -> None:
    result = run_cli("calibrate", "--out", str(tmp_path))
    assert result.exit_code != 0 and "give LABELS.csv" in result.output


def test_a_label_whose_judgment_failed_is_left_out_and_said(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    env.faults.status_if = lambda text: 400 if "Question 7?" in text else None
    run = graded_run(tmp_path / "run", env)
    rows = [[f"q{i}", COMPLETENESS[i]] for i in range(8)]
    labels = write_labels(tmp_path / "labels.csv", ["qa_id", "completeness"], rows)
    result = run_cli("calibrate", str(labels), "--out", str(run))
    assert result.exit_code == 0, result.output
    assert "Warning: 1 labelled rows left out: their judgment is an error row" in result.output
    assert calibration(run)["completeness"]["n"] == "7"


def test_labels_are_on_the_unit_or_ten_scale_and_help_offers_no_other(tmp_path: Path) -> None:
    shown = run_cli("calibrate", "--help")
    assert "<unit|ten>" in shown.output and "key-points" not in shown.output
    refused = run_cli("calibrate", "labels.csv", "--scale", "key-points", "--out", str(tmp_path))
    assert refused.exit_code == 2 and "Invalid value for '--scale'" in refused.output
