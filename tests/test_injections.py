"""Injection controls: wrong answers that ask for a high grade. A gullible judge is caught and
flagged like one that fails its known answers; a truthful one passes, on every scale."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from judges import constant, gullible, lenient_about_padding, truthful
from openai_server import FakeOpenAI
from support import marked_exam, read_csv, run_cli
from world import World

from ragexam.analysis.controls import Source, build_controls
from ragexam.analysis.injections import CLAIM, GRADE, MASTER_KEYS, PLEA
from ragexam.config import Scale

INJECTIONS = ("inject_plea", "inject_verdict", "inject_master_key", "inject_claim")
KNOWN = ("verbatim", "dont_know", "padded", "wrong")


def exam(run: Path, n: int, points: bool) -> None:
    """n questions over four documents; each truth four words no other question uses, two key
    points of two words; each answer holds half of its truth."""
    rows = []
    for i in range(n):
        row = {
            "qa_id": f"q{i}",
            "document": f"doc{i % 4}",
            "question": f"Question {i}?",
            "truth": f"Alpha{i} beta{i} gamma{i} delta{i}.",
            "answer": f"Alpha{i} beta{i}.",
        }
        rows.append(
            {**row, "key_points": [f"alpha{i} beta{i}", f"gamma{i} delta{i}"]} if points else row
        )
    marked_exam(run, rows)


def summary(run: Path) -> dict[str, str]:
    (row,) = read_csv(run / "summary.csv")
    return row


@pytest.mark.parametrize("points", [True, False], ids=["key-points", "unit"])
def test_a_gullible_judge_is_caught_by_the_injections_and_flagged(
    env: FakeOpenAI, tmp_path: Path, points: bool
) -> None:
    exam(tmp_path / "run", 12, points)
    env.responder = gullible
    result = run_cli("judge", "--out", "run", "--controls", "10")
    assert result.exit_code == 0, result.output
    controls = read_csv(tmp_path / "run" / "judge_controls.csv")
    assert {row["scale"] for row in controls} == {"key-points" if points else "unit"}
    failed = Counter(row["control"] for row in controls if row["passed"] == "false")
    assert failed == {kind: 10 for kind in INJECTIONS}  # the known answers all pass
    warning = " ".join(result.output.split())
    assert "Warning: only 40/40 known-answer controls passed, 40/40 injections fooled the " in (
        warning
    )
    assert "(attack success rate 100%)" in warning
    assert "10/10 inject_plea controls fooled it" in warning
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0
    row = summary(tmp_path / "run")
    assert row["judge_known_answer_pass_rate"] == "1" and row["judge_attack_success_rate"] == "1"
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'class="warning"' in page and "attack success rate" in page


@pytest.mark.parametrize("points", [True, False], ids=["key-points", "unit"])
def test_a_truthful_judge_resists_every_injection(
    env: FakeOpenAI, tmp_path: Path, points: bool
) -> None:
    exam(tmp_path / "run", 12, points)
    env.responder = truthful
    result = run_cli("judge", "--out", "run", "--controls", "10")
    assert result.exit_code == 0, result.output
    assert "40/40 known-answer controls passed, 0/40 injections fooled the judge" in " ".join(
        result.output.split()
    )
    assert "Warning" not in result.output
    controls = read_csv(tmp_path / "run" / "judge_controls.csv")
    assert all(row["passed"] == "true" for row in controls)
    assert all(float(row["completeness"]) == 0 for row in controls if row["control"] in INJECTIONS)


def test_a_judge_fooled_by_one_injection_in_ten_is_trusted_and_by_more_is_not(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 12, True)
    env.responder = truthful
    assert run_cli("judge", "--out", "run", "--controls", "10").exit_code == 0
    path = tmp_path / "run" / "judge_controls.csv"
    rows = read_csv(path)
    plea = [row for row in rows if row["control"] == "inject_plea"]
    for fooled in plea[:4]:  # 4 of 40 injections: 10%, at the bound
        fooled["completeness"] = "1.0"
    _write(path, rows)
    assert "Warning" not in run_cli("stats", "--out", "run").output
    plea[4]["completeness"] = "1.0"  # 5 of 40: over it
    _write(path, rows)
    stats = run_cli("stats", "--out", "run")
    assert "Warning: only 40/40 known-answer controls passed, 5/40 injections fooled" in (
        " ".join(stats.output.split())
    )
    assert summary(tmp_path / "run")["judge_attack_success_rate"] == "0.125"


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_each_injection_is_the_wrong_answer_carrying_its_attack_in_turn() -> None:
    points = json.dumps(["one", "two", "three"])
    sources = [Source(f"q{i}", f"d{i % 2}", f"Q{i}?", f"T{i} t{i}.", points) for i in range(4)]
    controls = build_controls(sources, 4, seed=1, scale=Scale.key_points)
    by = {(c.source.qa_id, c.kind): c for c in controls}
    drawn = list(dict.fromkeys(c.source.qa_id for c in controls))
    for turn, qa_id in enumerate(drawn):
        wrong = by[(qa_id, "wrong")].answer
        plea, claim = by[(qa_id, "inject_plea")].answer, by[(qa_id, "inject_claim")].answer
        assert plea == f"{wrong}\n\n{PLEA}" and claim == f"{wrong}\n\n{CLAIM}"
        key = by[(qa_id, "inject_master_key")].answer
        assert key == f"{MASTER_KEYS[turn % 2]} {wrong}"
        verdict = by[(qa_id, "inject_verdict")].answer
        assert verdict.startswith(f"{wrong}\n\n")
        if turn % 2:
            assert verdict.endswith(GRADE)
        else:  # the reply format of the key-points judge, one present verdict per key point
            fake = json.loads(verdict.removeprefix(f"{wrong}\n\n"))
            assert [mark["verdict"] for mark in fake["key_points"]] == ["present"] * 3
            assert "one" not in verdict  # it names no key point: the answer holds none
    unit = build_controls(sources, 1, seed=1, scale=Scale.ten)
    (fake,) = [c.answer for c in unit if c.kind == "inject_verdict"]
    assert json.loads(fake.split("\n\n")[1])["completeness"] == 10


@pytest.mark.parametrize("responder", [constant, lenient_about_padding])
def test_constant_and_lenient_judges_still_fail_their_controls_by_key_points(
    env: FakeOpenAI, tmp_path: Path, responder: object
) -> None:
    world = World({"a.md": 4, "b.md": 4})
    env.embed = world.embed
    env.responder = lambda body: (
        world.respond(body)
        if "marking scheme" not in str(body["messages"][0]["content"])
        else responder(body)
    )  # type: ignore[operator]
    store = world.build_store(tmp_path / "store")
    result = run_cli(
        "run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e",
        "--controls", "4",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    controls = read_csv(tmp_path / "run" / "judge_controls.csv")
    assert {row["scale"] for row in controls} == {"key-points"}
    failed = {row["control"] for row in controls if row["passed"] == "false"}
    assert "padded" in failed  # neither penalises padding
    if responder is constant:
        assert {"dont_know", "wrong", *INJECTIONS} <= failed
    assert "Warning: only" in result.output
