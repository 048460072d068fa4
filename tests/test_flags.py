"""Question checks: planted bad questions are flagged with the right reason, clean ones are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.documents import Document
from openai_server import JSON, FakeOpenAI, Reply
from support import ANSWER_HEADER, JUDGE_HEADER, build_store, read_csv, run_cli, write_csv
from world import section

from ragexam.io.csvfile import read_rows
from ragexam.stages.flags import cheap_flags

FILLER = " It is inspected every spring by the maintenance crew and logged in the plant register."
# chunk key -> (question, ground truth) the exam writer returns for it
PLANTED = {
    "alpha": ("According to the passage, what colour is the alpha valve?", "Green."),
    "beta": ("What colour is the beta valve?", "Red."),
    "gamma": ("What colour is the beta valve?", "Blue."),
    "delta": ("The delta valve is painted yellow; what colour is it?", "Painted yellow."),
    "short": ("How heavy is the short pipe?", "Two kilograms."),
    "zeta": ("What pressure does the zeta pump hold?", "Four bar."),
    "eta": ("Which document describes the eta pump's start-up?", "The eta start-up manual."),
}
REJECTED = "zeta"  # the critic finds its answer unsupported


def chunk_text(key: str) -> str:
    """The chunk of a key; the `short` one is under 100 characters."""
    return f"The {key} part." if key == "short" else f"The {key} part is described here." + FILLER


def respond(body: JSON) -> Reply | None:
    """The exam writer returns the planted pair; the critic rejects the REJECTED one."""
    messages = body["messages"]
    system, user = messages[0]["content"], messages[-1]["content"]
    key = next(key for key in PLANTED if f"The {key} part" in section(user, "chunk"))
    if system.startswith("You write exam questions"):
        question, answer = PLANTED[key]
        written = {"question": question, "answer": answer, "key_points": [answer]}
        return Reply(content=json.dumps(written))
    if system.startswith("You review exam questions"):
        ok = key != REJECTED
        review = {"reasoning": "checked", "standalone": True, "answerable": True, "supported": ok}
        return Reply(content=json.dumps(review))
    return None


def generate(env: FakeOpenAI, tmp_path: Path, *extra: str) -> dict[str, str]:
    """Generate from the planted store; each chunk key's flags."""
    env.responder = respond
    store = tmp_path / "store"
    if not store.exists():
        docs = [Document(chunk_text(key), metadata={"source": "plant.md"}) for key in PLANTED]
        build_store(store, docs)
    out = tmp_path / ("checked" if extra else "run")
    result = run_cli("generate", "--chroma", str(store), "--out", str(out), *extra)
    assert result.exit_code == 0, result.output
    rows = read_csv(out / "qa_dataset.csv")
    return {row["question"] + row["ground_truth_answer"]: row["flags"] for row in rows}


def flags_by_key(flags: dict[str, str]) -> dict[str, str]:
    return {key: flags[question + answer] for key, (question, answer) in PLANTED.items()}


def test_planted_bad_questions_are_flagged_with_their_reason(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    flags = flags_by_key(generate(env, tmp_path))
    assert flags["alpha"] == "refers_to_text"
    assert flags["delta"] == "answer_in_question"
    assert flags["short"] == "short_chunk"
    # beta and gamma ask the same question: whichever was written second is the duplicate
    assert sorted([flags["beta"], flags["gamma"]]) == ["", "duplicate_question"]
    assert flags["zeta"] == "" and flags["eta"] == ""  # "which document" is a fair question


def test_check_makes_one_critic_call_per_row_and_flags_what_it_rejects(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    generate(env, tmp_path)
    plain = env.count()
    assert plain == len(PLANTED)
    flags = flags_by_key(generate(env, tmp_path, "--check"))
    assert env.count() - plain == 2 * len(PLANTED)
    assert flags["zeta"] == "unsupported_answer"
    assert flags["eta"] == "" and flags["alpha"] == "refers_to_text"


@pytest.mark.parametrize(
    ("question", "truth", "chars", "expected"),
    [
        ("What does this text say about pumps?", "Nothing.", 500, ["refers_to_text"]),
        ("In the given context, who signs?", "The clerk.", 500, ["refers_to_text"]),
        ("Which context manager closes files?", "with open().", 500, []),
        ("Is the valve RED?", "red", 500, ["answer_in_question"]),
        ("Is the valve reddish?", "red", 500, []),  # a whole-word match only
        ("How many?", "Ten.", 99, ["short_chunk"]),
        ("How many?", "Ten.", 100, []),
        ("how  MANY?", "Ten.", 100, ["duplicate_question"]),
    ],
)
def test_cheap_flags(question: str, truth: str, chars: int, expected: list[str]) -> None:
    earlier = {"how many"} if "  " in question else set()
    assert cheap_flags(question, truth, chars, earlier) == expected


QA_HEADER = ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status", "error"]


def flagged_run(folder: Path) -> Path:
    """A: q1 flagged (completeness 0), q2 (1.0), q3 (0.5); B: q4 (0.2); q1 and q4 in validation."""
    folder.mkdir(parents=True)
    rows = [
        ["q1", "c1", "A", "Q1", "T", "ok", "", "refers_to_text", "validation"],
        ["q2", "c2", "A", "Q2", "T", "ok", "", "", "test"],
        ["q3", "c3", "A", "Q3", "T", "ok", "", "", "test"],
        ["q4", "c4", "B", "Q4", "T", "ok", "", "", "validation"],
    ]
    write_csv(folder / "qa_dataset.csv", [*QA_HEADER, "flags", "split"], rows)
    answers = [
        [q, "a", "[]", rank, "ok", ""] for q, rank in (("q1", 1), ("q2", 1), ("q3", ""), ("q4", 2))
    ]
    write_csv(folder / "answers.csv", ANSWER_HEADER, answers)
    scores = {"q1": 0.0, "q2": 1.0, "q3": 0.5, "q4": 0.2}
    write_csv(
        folder / "judgments.csv", JUDGE_HEADER, [[q, s, 1.0, "ok", ""] for q, s in scores.items()]
    )
    return folder


def by_document(folder: Path, *args: str) -> dict[str, dict[str, str]]:
    result = run_cli("stats", "--out", str(folder), *args)
    assert result.exit_code == 0, result.output
    rows = read_rows(folder / "summary_by_document.csv", ["document"])
    rows += read_rows(folder / "summary.csv", ["document"])
    return {row["document"]: row for row in rows}


def test_stats_counts_flagged_and_can_leave_them_out_or_keep_one_split(tmp_path: Path) -> None:
    run = flagged_run(tmp_path / "run")
    every = by_document(run)
    assert every["A"]["flagged"] == "1" and every["ALL"]["flagged"] == "1"
    assert float(every["A"]["completeness_mean"]) == pytest.approx(1.5 / 3)
    assert float(every["A"]["hit_rate"]) == pytest.approx(2 / 3)
    clean = by_document(run, "--exclude-flagged")
    assert clean["A"]["questions"] == "3" and clean["A"]["flagged"] == "1"
    assert clean["A"]["n_judged"] == "2" and clean["A"]["n_answered"] == "2"
    assert float(clean["A"]["completeness_mean"]) == pytest.approx(1.5 / 2)
    assert float(clean["A"]["hit_rate"]) == pytest.approx(1 / 2)
    assert float(clean["ALL"]["completeness_mean"]) == pytest.approx(1.7 / 3)
    test = by_document(run, "--split", "test")
    assert set(test) == {"A", "ALL"} and test["A"]["questions"] == "2"
    assert float(test["ALL"]["completeness_mean"]) == pytest.approx(0.75)
    unknown = run_cli("stats", "--out", str(run), "--split", "train")
    assert unknown.exit_code == 2 and "test, validation" in unknown.output
    write_csv(run / "qa_dataset.csv", QA_HEADER, [["q1", "c1", "A", "Q1", "T", "ok", ""]])
    unsplit = run_cli("stats", "--out", str(run), "--split", "test")
    assert unsplit.exit_code == 2 and "generate with --split" in unsplit.output
