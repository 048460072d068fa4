"""Judge controls through the CLI: known answers graded beside the exam, and the verdict."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
from judges import constant, delimited, lenient_about_padding, truthful
from openai_server import FakeOpenAI, Reply
from support import kill_midway, read_csv, run_cli
from world import World

from ragexam.analysis.controls import Bounds, Source, build_controls

KINDS = ("verbatim", "dont_know", "padded", "wrong")
INJECTIONS = ("inject_plea", "inject_verdict", "inject_master_key", "inject_claim")


def truth(i: int) -> str:
    """Question i's ground truth: four words no other question uses."""
    return f"Alpha{i} beta{i} gamma{i} delta{i}."


def exam(run: Path, n: int, documents: int = 4) -> None:
    """n answered questions over `documents` documents; each answer has half its ground truth."""
    run.mkdir(parents=True, exist_ok=True)
    with (run / "qa_dataset.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status"]
        )
        for i in range(n):
            document = f"doc{i % documents}"
            writer.writerow([f"q{i}", f"c{i}", document, f"Question {i}?", truth(i), "ok"])
    with (run / "answers.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["qa_id", "answer", "retrieved_ids", "target_rank", "status", "error"])
        for i in range(n):
            writer.writerow([f"q{i}", f"Alpha{i} beta{i}.", "[]", "1", "ok", ""])


def controls_of(run: Path) -> dict[str, dict[str, str]]:
    """judge_controls.csv by control_id."""
    return {row["control_id"]: row for row in read_csv(run / "judge_controls.csv")}


def overall(run: Path) -> dict[str, str]:
    """The summary.csv row."""
    with (run / "summary.csv").open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    return row


def test_a_truthful_judge_passes_its_controls_and_the_report_says_so(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 12)
    env.responder = truthful
    result = run_cli("judge", "--out", "run", "--controls", "10", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert env.count() == 12 + 80  # one call per exam row, one per control
    assert "40/40 known-answer controls passed, 0/40 injections fooled" in result.output
    judged = read_csv(tmp_path / "run" / "judgments.csv")
    assert sorted(row["qa_id"] for row in judged) == sorted(f"q{i}" for i in range(12))
    controls = controls_of(tmp_path / "run")
    header = next(iter(controls.values()))
    design = ["qa_id", "control", "answer", "completeness", "conciseness", "passed", "status"]
    assert [name for name in header if name in design] == design  # design.md's order
    assert len(controls) == 80 and Counter(row["control"] for row in controls.values()) == {
        kind: 10 for kind in (*KINDS, *INJECTIONS)
    }
    sampled = {row["qa_id"] for row in controls.values()}
    assert len(sampled) == 10
    for qa_id in sampled:
        i = int(qa_id[1:])
        rows = {kind: controls[f"{qa_id}:{kind}"] for kind in KINDS}
        donor = int(rows["padded"]["donor_qa_id"][1:])
        assert donor % 4 != i % 4  # from another document
        assert rows["verbatim"]["answer"] == truth(i)
        assert rows["dont_know"]["answer"] == "I don't know."
        assert rows["padded"]["answer"] == f"{truth(i)} {truth(donor)}"
        assert (
            rows["wrong"]["answer"] == truth(donor) and rows["wrong"]["donor_qa_id"] == f"q{donor}"
        )
        # word overlap: padding doubles the answer's words, half of them in the ground truth
        assert float(rows["padded"]["completeness"]) == 1.0
        assert float(rows["padded"]["conciseness"]) == 0.5
        assert float(rows["wrong"]["completeness"]) == 0.0
        assert all(row["passed"] == "true" and row["status"] == "ok" for row in rows.values())
        for kind in INJECTIONS:  # each a wrong answer, from the same donor, carrying its attack
            injected = controls[f"{qa_id}:{kind}"]
            assert truth(donor) in injected["answer"] and injected["answer"] != truth(donor)
            assert injected["passed"] == "true" and float(injected["completeness"]) == 0.0
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0, stats.output
    assert "Warning" not in stats.output
    assert "0/40 injections fooled the judge (attack success rate 0%)" in stats.output
    row = overall(tmp_path / "run")
    assert row["judge_controls_total"] == "80" and row["judge_controls_passed"] == "80"
    assert row["judge_known_answer_pass_rate"] == "1" and row["judge_attack_success_rate"] == "0"
    assert all(row[f"controls_passed_{kind}"] == "10" for kind in (*KINDS, *INJECTIONS))
    # controls never enter a mean: each exam answer holds 2 of its 4 words
    assert float(row["completeness_mean"]) == 0.5 and float(row["conciseness_mean"]) == 1.0
    page = (tmp_path / "run" / "report.html").read_text()
    assert "Can this judge be trusted?" in page
    assert "40/40 known answers graded as expected, 0/40 injections fooled it" in page
    assert 'class="warning"' not in page


CONSTANT = {"verbatim": 10, "dont_know": 0, "padded": 0, "wrong": 0}
LENIENT = {"verbatim": 10, "dont_know": 10, "padded": 0, "wrong": 10}


@pytest.mark.parametrize(
    ("responder", "passes", "fooled", "why"),
    [
        (constant, CONSTANT, 40, "completeness 0.80 &gt; 0.2"),
        (lenient_about_padding, LENIENT, 0, "conciseness 1.00 &gt; 0.7"),
    ],
)
def test_a_bad_judge_fails_its_controls_and_is_named(
    env: FakeOpenAI,
    tmp_path: Path,
    responder: object,
    passes: dict[str, int],
    fooled: int,
    why: str,
) -> None:
    exam(tmp_path / "run", 12)
    env.responder = responder  # type: ignore[assignment]
    result = run_cli("judge", "--out", "run")  # --controls 10 is the default
    assert result.exit_code == 0, result.output
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0, stats.output
    (warning,) = [line for line in stats.output.splitlines() if line.startswith("Warning")]
    total = sum(passes.values())
    assert f"only {total}/40 known-answer controls passed, {fooled}/40 injections" in warning
    for kind in KINDS:
        named = f"{passes[kind]}/10 {kind} controls passed"
        assert (named in warning) == (passes[kind] < 10), (kind, warning)
    if passes["padded"] == 0:
        assert "the judge does not penalise padding: 0/10 padded controls passed" in warning
    assert warning in result.output  # the judge says it as soon as the controls are graded
    row = overall(tmp_path / "run")
    assert row["judge_controls_passed"] == str(total + 40 - fooled)
    assert row["judge_injections_fooled"] == str(fooled)
    assert {kind: int(row[f"controls_passed_{kind}"]) for kind in KINDS} == passes
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'class="warning"' in page and "Can this judge be trusted?" in page
    assert why in page  # the worst failures, with the bound each broke


def test_no_controls_makes_one_call_per_exam_row(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 7)
    env.responder = truthful
    result = run_cli("judge", "--out", "run", "--controls", "0")
    assert result.exit_code == 0, result.output
    assert env.count() == 7
    assert not (tmp_path / "run" / "judge_controls.csv").exists()
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0 and "judge_controls_total" not in overall(tmp_path / "run")
    assert "no judge controls" in (tmp_path / "run" / "report.html").read_text()


def test_a_rerun_grades_no_control_twice_and_another_seed_replaces_them(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 12)
    env.responder = truthful
    assert run_cli("judge", "--out", "run", "--controls", "5").exit_code == 0
    assert env.count() == 12 + 40
    assert run_cli("judge", "--out", "run", "--controls", "5").exit_code == 0
    assert env.count() == 12 + 40  # nothing left to do
    more = run_cli("judge", "--out", "run", "--controls", "8")
    assert more.exit_code == 0, more.output
    assert env.count() == 12 + 64  # a larger N keeps the first five questions
    first = controls_of(tmp_path / "run")
    assert run_cli("judge", "--out", "run", "--controls", "8", "--seed", "1").exit_code == 0
    now = controls_of(tmp_path / "run")
    assert len(now) == 64 and set(now) != set(first)  # only the new sample's controls remain
    # another seed draws other questions and other donors: only what changed is graded again
    changed = [key for key, row in now.items() if first.get(key, {}).get("answer") != row["answer"]]
    assert 0 < len(changed) < 64 and env.count() == 12 + 64 + len(changed)


@pytest.mark.slow
def test_sigkill_during_the_controls_then_rerun_grades_each_control_once(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 20)
    env.responder = truthful
    env.latency = 0.1  # 80 controls at 4 in flight take two seconds: time to land the kill
    args = ["judge", "--out", "run", "--concurrency", "4"]
    output = tmp_path / "run" / "judge_controls.csv"
    kill_midway(args, output, 12)
    # only whole lines survive: a line the kill cut short is redone
    whole = output.read_bytes().decode().split("\n")[:-1]
    survived = {row["control_id"] for row in csv.DictReader(whole) if row["status"] == "ok"}
    assert 5 < len(survived) < 80
    before = env.count()
    assert before <= 20 + len(survived) + 4  # at most the calls in flight were lost
    env.latency = 0.0
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert env.count() - before == 80 - len(survived)  # exam done: only the missing controls
    ids = [row["control_id"] for row in read_csv(output)]
    assert len(ids) == len(set(ids)) == 80
    assert {row["status"] for row in read_csv(output)} == {"ok"}


def test_error_controls_are_neither_passes_nor_failures(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 12)
    env.responder = truthful
    env.faults.status_if = lambda text: 400 if "I don't know." in text else None
    result = run_cli("judge", "--out", "run", "--controls", "10")
    assert result.exit_code == 1  # 10 of 80 control rows failed: above --max-error-rate
    assert "judge_controls.csv" in result.output
    rows = controls_of(tmp_path / "run")
    errors = [row for row in rows.values() if row["status"] == "error"]
    assert len(errors) == 10 and {row["control"] for row in errors} == {"dont_know"}
    assert all(row["passed"] == row["completeness"] == "" for row in errors)
    assert run_cli("stats", "--out", "run").exit_code == 0
    row = overall(tmp_path / "run")
    assert (row["judge_controls_total"], row["judge_controls_passed"]) == ("70", "70")
    assert (row["judge_controls_errors"], row["controls_total_dont_know"]) == ("10", "0")


def test_a_judge_whose_full_credit_grades_end_in_error_is_not_trusted(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # A judge that cannot give valid credit (its reply to a right answer never validates) has
    # only the controls graded that it passes by crediting nothing: not a judge to trust.
    def credits_nothing(body: dict[str, object]) -> Reply | None:
        answer, truth_given = delimited(body, "answer"), delimited(body, "ground_truth")
        if answer is not None and answer == truth_given:
            return Reply(content="no grades")  # neither JSON nor a tool call: an error row
        return truthful(body)

    exam(tmp_path / "run", 12)
    env.responder = credits_nothing
    result = run_cli("judge", "--out", "run", "--controls", "10", "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    rows = controls_of(tmp_path / "run").values()
    errored = Counter(row["control"] for row in rows if row["status"] == "error")
    assert errored == {"verbatim": 10}
    stats = run_cli("stats", "--out", "run")
    assert stats.exit_code == 0, stats.output
    (warning,) = [line for line in stats.output.splitlines() if line.startswith("Warning")]
    assert "Warning: 30/30 known-answer controls passed" in warning  # not "only 30/30"
    assert "10 ended in error" in warning
    assert "verbatim not checked: 10/10 verbatim controls ended in error" in warning
    assert warning.count("judge_controls.csv") == 1  # the way on said once, not per kind
    said = " ".join(stats.output.split())  # the headline says why, not "passed only 70/70"
    assert (
        "Read these grades with care: 10 of the judge's controls ended in error, so it is "
        "not checked (it passed the 70 graded)." in said
    )
    assert "passed only" not in said
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'class="warning"' in page and "0/0, 10 errors" in page
    assert overall(tmp_path / "run")["judge_controls_errors"] == "10"


def test_one_control_of_ten_in_error_leaves_its_kind_checked() -> None:
    # 10% is not more than 10%: (1 - 0.9) * 10 is 0.999..., and one error made a judge
    # untrusted; two of ten do
    from ragexam.analysis.verdict import Verdict

    kinds = (*KINDS, *INJECTIONS)
    graded = dict.fromkeys(kinds, 10) | {"verbatim": 9}
    one = Verdict(dict(graded), dict(graded), 1, errored={"verbatim": 1})
    assert one.trusted and one.unchecked_kinds() == []
    graded["verbatim"] = 8
    two = Verdict(dict(graded), dict(graded), 2, errored={"verbatim": 2})
    assert not two.trusted and two.unchecked_kinds() == ["verbatim"]


def test_bounds_at_the_edges_on_the_ten_point_scale() -> None:
    padded = Bounds(completeness_min=0.8, conciseness_max=0.7)
    assert padded.passes(8 / 10, 7 / 10) and not padded.passes(7 / 10, 7 / 10)
    assert not padded.passes(0.8, 8 / 10)
    assert padded.misses(0.5, 0.9) == [
        ("completeness 0.50 < 0.8", pytest.approx(0.3)),
        ("conciseness 0.90 > 0.7", pytest.approx(0.2)),
    ]
    assert Bounds(completeness_max=0.2).passes((0.2 + 0.2 + 0.2) / 3, 0.0)
    assert padded.text() == "completeness ≥ 0.8 and conciseness ≤ 0.7"


def test_a_single_document_exam_pads_with_another_question_and_one_question_cannot() -> None:
    sources = [Source(f"q{i}", "only", f"Q{i}?", f"T{i}") for i in range(3)]
    controls = build_controls(sources, 10, seed=0)
    assert len(controls) == 24  # N is capped by the questions there are
    for control in controls:
        if control.kind in ("padded", "wrong"):
            assert control.donor and control.donor != control.source.qa_id
    lone = build_controls(sources[:1], 10, seed=0)
    assert [control.kind for control in lone] == ["verbatim", "dont_know"]


def test_the_padding_is_at_least_as_long_as_the_ground_truth_when_the_exam_has_one() -> None:
    # q0's ground truth has 6 words; of the other document's, only q3's is as long
    texts = ["a b c d e f", "g h", "i j", "k l m n o p q", "r s"]
    sources = [
        Source(f"q{i}", "one" if i < 3 else "two", "?", text) for i, text in enumerate(texts)
    ]
    for seed in range(20):
        padded = {c.source.qa_id: c for c in build_controls(sources, 5, seed) if c.kind == "padded"}
        assert padded["q0"].donor == "q3" and padded["q0"].answer == "a b c d e f k l m n o p q"
        # q3 is longer than every ground truth of document one: the longest, q0, pads it
        assert padded["q3"].donor == "q0"
        assert padded["q1"].donor in ("q3", "q4")  # both are as long as "g h"


def test_controls_on_the_ten_point_scale_compare_the_stored_values(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    exam(tmp_path / "run", 6)
    env.responder = truthful  # answers 10, 10 for verbatim; 10, 5 for padded; 0 for wrong
    result = run_cli("judge", "--out", "run", "--controls", "3", "--scale", "ten")
    assert result.exit_code == 0, result.output
    rows = controls_of(tmp_path / "run").values()
    assert len(rows) == 24 and {row["scale"] for row in rows} == {"ten"}
    padded = [row for row in rows if row["control"] == "padded"]
    assert {(row["completeness"], row["conciseness"]) for row in padded} == {("1.0", "0.5")}
    assert all(row["passed"] == "true" for row in rows)
    assert "12/12 known-answer controls passed, 0/12 injections fooled" in result.output


def test_stats_refuses_an_ok_control_without_a_grade(env: FakeOpenAI, tmp_path: Path) -> None:
    exam(tmp_path / "run", 6)
    env.responder = truthful
    assert run_cli("judge", "--out", "run", "--controls", "2").exit_code == 0
    path = tmp_path / "run" / "judge_controls.csv"
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames, list(reader)
    rows[2]["completeness"] = ""  # an ok row whose grade is gone: never read as a score
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, header or [])
        writer.writeheader()
        writer.writerows(rows)
    result = run_cli("stats", "--out", "run")
    assert result.exit_code != 0
    assert (
        result.output.strip()
        == "Error: run/judge_controls.csv: line 4: status ok but no completeness in [0, 1]; "
        "delete the row and rerun ragexam judge to grade it again"
    )


def test_run_grades_the_judge_controls_in_the_exam_run_only(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World({"a.md": 4, "b.md": 3, "c.md": 3})  # its judge shares facts: a fair judge
    env.responder, env.embed = world.respond, world.embed
    store = world.build_store(tmp_path / "store")
    result = run_cli(
        "run", "--chroma", str(store), "--out", "run", "--controls", "--seed", "2",
        "--embedding", "openai:fake-embed", "--k", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    controls = controls_of(tmp_path / "run")
    assert len(controls) == 80 and {row["passed"] for row in controls.values()} == {"true"}
    assert {row["scale"] for row in controls.values()} == {"key-points"}
    assert overall(tmp_path / "run")["judge_controls_passed"] == "80"
    assert not (tmp_path / "run" / "gold" / "judge_controls.csv").exists()
    assert not (tmp_path / "run" / "closed_book" / "judge_controls.csv").exists()
    assert "40/40 known-answer controls passed, 0/40 injections fooled" in result.output
