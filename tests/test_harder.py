"""generate --multi-hop and --unanswerable against a world whose right answers are known: what is
kept is verified, what is dropped says why, and the calls are counted and priced."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from openai_server import FakeOpenAI, hashed_embedding
from support import edit_cell, read_csv, run_cli
from world import FACT, MISSING, TAG, World

from ragexam.llm.prompts import prompts_dir
from ragexam.stages.harder import KeyedQA

# Two documents of four records; record i of a.md and of b.md share a topic (their vectors lie
# close). Record 2 of a.md restates record 1's facts, the writer invents a fact about record 3
# of b.md, and an unanswerable question seeded by record 0 of a.md asks about that record.
LINKED = {(0, i): (1, i) for i in range(4)}


def world(**changes: object) -> World:
    """The linked world, with some of its knobs changed."""
    knobs: dict[str, object] = {
        "partners": LINKED,
        "repeats": {(0, 2)},
        "invents": {(1, 3)},
        "answered": {(0, 0)},
    }
    return World({"a.md": 4, "b.md": 4}, **{**knobs, **changes})  # type: ignore[arg-type]


def generate(env: FakeOpenAI, tmp_path: Path, the_world: World, *args: str) -> Path:
    """`ragexam generate` over the world's store; the run folder."""
    env.responder, env.embed = the_world.respond, the_world.embed
    store = tmp_path / "store"
    if not store.exists():
        the_world.build_store(store)
    out = tmp_path / "run"
    command = ["generate", "--chroma", str(store), "--out", str(out)]
    result = run_cli(*command, "--embedding", "openai:fake-embed", *args)
    assert result.exit_code == 0, result.output
    (tmp_path / "output.txt").write_text(result.output, encoding="utf-8")
    return out


def records(text: str) -> list[tuple[int, int]]:
    return [(int(d), int(i)) for d, i in TAG.findall(text)]


def test_a_kept_multi_hop_question_needs_both_chunks_and_a_dropped_one_says_why(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    the_world = world()
    out = generate(env, tmp_path, the_world, "--multi-hop", "20")  # more than there are pairs
    kept = [row for row in read_csv(out / "qa_dataset.csv") if row["kind"] == "multi-hop"]
    dropped = read_csv(out / "dropped_questions.csv")
    assert kept and dropped
    for row in kept:
        chunks = json.loads(row["chunk_ids"])
        first, second = (tuple(map(int, c[1:].split("-"))) for c in chunks)
        assert row["chunk_id"] == chunks[0] and len(chunks) == 2
        hashes = row["chunk_hash"].split()  # each chunk's text, found again in a store rebuilt
        assert len(hashes) == 2 and hashes[0] != hashes[1]
        # The known right answer: every fact the two chunks state, from both of them.
        truth = the_world.pair_truth(first, second)  # type: ignore[arg-type]
        assert FACT.findall(row["ground_truth_answer"]) == truth
        assert [FACT.findall(point)[0] for point in json.loads(row["key_points"])] == truth
        checks = json.loads(row["verification"])["checks"]
        assert [check["context"] for check in checks] == ["both", "first", "second"]
        assert set(checks[0]["key_points"]) == {"present"}
        assert "absent" in checks[1]["key_points"] and "absent" in checks[2]["key_points"]
        assert row["calls"] == "7" and row["link"] in ("neighbours", "near")
    reasons = {row["reason"]: records(row["question"]) for row in dropped}
    # The pair whose second chunk repeats the first's facts: one chunk answers it all.
    assert reasons["answerable from the first chunk alone"] == [(0, 1), (0, 2)]
    assert reasons["not answerable from both chunks"][0] == (1, 3)  # the invented fact
    assert {row["link"] for row in kept} == {"neighbours", "near"}
    said = (tmp_path / "output.txt").read_text()
    assert f"multi-hop: kept {len(kept)} of 20 asked" in said and "1 not answerable" in said


def test_multi_hop_keeps_exactly_n_then_a_rerun_resumes_and_asks_for_more(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    out = generate(env, tmp_path, world(), "--multi-hop", "2")
    first = read_csv(out / "qa_dataset.csv")
    assert sum(row["kind"] == "multi-hop" for row in first) == 2
    singles = sum(row["kind"] == "single" for row in first)
    calls = env.count()
    generate(env, tmp_path, world(), "--multi-hop", "2")
    assert env.count() == calls  # nothing left to do: no call
    generate(env, tmp_path, world(), "--multi-hop", "4")
    rows = read_csv(out / "qa_dataset.csv")
    assert sum(row["kind"] == "multi-hop" for row in rows) == 4
    assert sum(row["kind"] == "single" for row in rows) == singles
    assert len({row["qa_id"] for row in rows}) == len(rows)
    manifest = json.loads((out / "manifest.json").read_text())["stages"]["generate"]
    assert manifest["options"]["multi_hop"] == 4 and manifest["harder"]["multi-hop"]["kept"] == 4


@pytest.mark.parametrize("misreads", [False, True], ids=["reads-right", "quotes-yet-denies"])
def test_an_unanswerable_question_is_kept_when_the_nearest_chunks_do_not_answer_it(
    env: FakeOpenAI, tmp_path: Path, misreads: bool
) -> None:
    # A reader that quotes the chunk answering the question, yet says none does, is read by
    # its quote: the chunks' own words that answer it.
    out = generate(env, tmp_path, world(misreads=misreads), "--unanswerable", "8")
    kept = [row for row in read_csv(out / "qa_dataset.csv") if row["kind"] == "unanswerable"]
    assert kept
    for row in kept:
        ((d, i),) = records(row["question"])
        assert i >= MISSING  # about a record no chunk holds
        assert row["chunk_id"] == "" and json.loads(row["chunk_ids"]) == []
        checks = json.loads(row["verification"])
        assert checks["seed"] == f"c{d}-{i - MISSING}"
        (nearest,) = checks["checks"]
        assert nearest["answered"] is False and nearest["quote"] == ""
        assert len(nearest["chunks"]) == 8  # the ten nearest: all the store holds
    (dropped,) = read_csv(out / "dropped_questions.csv")
    assert dropped["reason"] == "answered by the nearest chunks"
    assert records(dropped["question"]) == [(0, 0)]  # the seed the store answers
    (reading,) = json.loads(dropped["verification"])["checks"]
    assert reading["answered"] is True and reading["quote_found"] is True
    assert reading["said"] is not misreads  # the reader's own verdict, kept beside
    assert FACT.findall(reading["quote"]) == ["fact0x0a", "fact0x0b", "fact0x0c"]


def test_verification_calls_are_recorded_and_priced(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "1")
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "2")
    out = generate(env, tmp_path, world(), "--multi-hop", "20", "--unanswerable", "3")
    rows = read_csv(out / "qa_dataset.csv") + read_csv(out / "dropped_questions.csv")
    harder = [row for row in rows if row["kind"] != "single"]
    singles = len(rows) - len(harder)
    assert sum(int(row["calls"]) for row in harder) + singles == env.count()
    record = json.loads((out / "manifest.json").read_text())["stages"]["generate"]
    billed = [record["tokens_billed"]]
    billed += [role["tokens_billed"] for role in record["verification"].values()]
    prompt = sum(tokens["prompt"] for tokens in billed)
    completion = sum(tokens["completion"] for tokens in billed)
    assert prompt + completion == sum(r.usage["total_tokens"] for r in env.requests if r.usage)
    assert record["cost_usd"] == pytest.approx((prompt + 2 * completion) / 1e6)
    calls = record["harder"]["multi-hop"]["calls"]
    assert record["harder"]["multi-hop"]["calls_per_kept"] == pytest.approx(
        calls / record["harder"]["multi-hop"]["kept"], abs=0.01
    )


def test_harder_questions_are_written_in_the_chunks_language(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    french = world(language="fr", repeats=set(), invents=set(), answered=set())
    out = generate(env, tmp_path, french, "--multi-hop", "2", "--unanswerable", "2")
    rows = read_csv(out / "qa_dataset.csv")
    assert {row["kind"] for row in rows} == {"single", "multi-hop", "unanswerable"}
    for row in rows:
        assert row["language"] == "French"
        assert row["question"].startswith("Quels faits"), row["question"]
        truth = row["ground_truth_answer"]
        assert " et " in truth or truth.startswith("Les documents ne disent pas"), truth
        points = json.loads(row["key_points"] or "[]")
        assert all(not point.startswith("The documents") for point in points)


def test_without_the_language_rule_a_french_store_gets_english_questions(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The control of the test above: the world's writer writes English unless told otherwise,
    # as models do, so the test above fails when the prompts stop asking for the language.
    edited = tmp_path / "prompts"
    shutil.copytree(prompts_dir(), edited)
    for path in edited.glob("generate*.toml"):
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace("language of the", "language of your"), encoding="utf-8")
    monkeypatch.setenv("RAGEXAM_PROMPTS_DIR", str(edited))
    french = world(language="fr", repeats=set(), invents=set(), answered=set())
    out = generate(env, tmp_path, french, "--multi-hop", "1", "--unanswerable", "1")
    rows = read_csv(out / "qa_dataset.csv")
    assert {row["kind"] for row in rows} == {"single", "multi-hop", "unanswerable"}
    assert all(row["question"].startswith("Which facts") for row in rows)


def test_a_run_sits_and_grades_every_kind(env: FakeOpenAI, tmp_path: Path) -> None:
    the_world = world(repeats=set(), invents=set(), answered=set())
    env.responder, env.embed = the_world.respond, the_world.embed
    store = the_world.build_store(tmp_path / "store")
    out = tmp_path / "run"
    result = run_cli(
        "run", "--chroma", str(store), "--out", str(out), "--embedding", "openai:fake-embed",
        "--multi-hop", "3", "--unanswerable", "2", "--k", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    exam = {row["qa_id"]: row for row in read_csv(out / "qa_dataset.csv")}
    for row in read_csv(out / "answers.csv"):
        kind = exam[row["qa_id"]]["kind"]
        expected = {"single": [[1]], "multi-hop": [[1, 2], [2, 1]], "unanswerable": [[]]}[kind]
        assert json.loads(row["target_ranks"]) in expected, row
    by_kind = {row["kind"]: row for row in read_csv(out / "summary_by_kind.csv")}
    assert list(by_kind) == ["single", "multi-hop", "unanswerable", "ALL"]
    assert float(by_kind["multi-hop"]["all_found"]) == 1.0
    assert float(by_kind["unanswerable"]["declined"]) == 1.0  # the world's answerer declines
    assert float(by_kind["unanswerable"]["made_up"]) == 0.0
    assert by_kind["ALL"]["questions"] == str(8 + 3 + 2)
    # "I don't know" is the right answer to an unanswerable question: no control is made of one.
    controls = read_csv(out / "judge_controls.csv")
    unanswerable = {qa_id for qa_id, row in exam.items() if row["kind"] == "unanswerable"}
    assert controls and not {row["qa_id"] for row in controls} & unanswerable
    assert all(row["passed"] == "true" for row in controls)


def test_the_dry_run_counts_the_calls_a_run_without_drops_makes(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    clean = world(repeats=set(), invents=set(), answered=set())
    args = ("--multi-hop", "3", "--unanswerable", "2")
    generate(env, tmp_path, clean, "--dry-run", *args)
    said = (tmp_path / "output.txt").read_text()
    assert env.count() == 0 and "generate multi-hop: 3 rows to do, 21 calls" in said
    # out: per question a question written (90), three answers (150) and three markings (200)
    assert re.search(
        r"generate multi-hop: 3 rows to do, 21 calls, ~[\d,]+ tokens in \+ ~3,420 out", said
    )
    assert "generate unanswerable: 2 rows to do, 4 calls" in said
    generate(env, tmp_path, clean, *args)
    assert env.count() == 8 + 21 + 4  # the single questions, then 7 and 2 calls a question
    generate(env, tmp_path, clean, "--dry-run", *args)
    assert "generate multi-hop: 0 rows to do, 0 calls" in (tmp_path / "output.txt").read_text()


def answered_by_a_model_that_makes_facts_up(env: FakeOpenAI, tmp_path: Path) -> Path:
    """A run of 4 unanswerable questions (and the single ones) whose model makes up the facts
    of records that no chunk holds, when it writes the exam as when it answers; its folder."""
    guessing = world(answered=set(), guesses={"a.md", "b.md"})
    out = generate(env, tmp_path, guessing, "--unanswerable", "4")
    common = ("--out", str(out), "--embedding", "openai:fake-embed")
    assert run_cli("answer", "--chroma", str(tmp_path / "store"), *common).exit_code == 0
    return out


def test_a_rag_system_that_makes_facts_up_is_caught_by_questions_its_model_wrote(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # What the exam keeps depends on the store, not on the model declining.
    out = answered_by_a_model_that_makes_facts_up(env, tmp_path)
    assert run_cli("judge", "--out", str(out)).exit_code == 0
    result = run_cli("stats", "--out", str(out))
    assert result.exit_code == 0, result.output
    by_kind = {row["kind"]: row for row in read_csv(out / "summary_by_kind.csv")}
    assert by_kind["unanswerable"]["questions"] == "4"
    assert float(by_kind["unanswerable"]["declined"]) == 0.0
    assert float(by_kind["unanswerable"]["made_up"]) == 1.0
    assert float(by_kind["single"]["completeness_mean"]) == 1.0  # what the store holds it knows
    said = " ".join(result.output.split())  # and the report's first sentence says it first
    made_up = "100% of 4 graded unanswerable questions get made-up answers; stop the made-up"
    assert made_up in said


def test_a_made_up_answer_to_an_unanswerable_question_is_lost_in_generation_not_retrieval(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    out = answered_by_a_model_that_makes_facts_up(env, tmp_path)
    judge = ("judge", "--out", str(out), "--scale", "key-points", "--with-context")
    assert run_cli(*judge).exit_code == 0
    kinds = {row["qa_id"]: row["kind"] for row in read_csv(out / "qa_dataset.csv")}
    rows = read_csv(out / "judgments.csv")
    made_up = [row for row in rows if kinds[row["qa_id"]] == "unanswerable"]
    assert len(made_up) == 4
    for row in made_up:  # the judge found the point in no chunk: there is no answer to find
        assert json.loads(row["key_point_context"]) == [False]
        assert float(row["lost_in_generation"]) == 1.0 and float(row["lost_in_retrieval"]) == 0
    # A row graded before the rule counted the miss in retrieval: stats reads it by the rule.
    edit_cell(out / "judgments.csv", made_up[0]["qa_id"], "lost_in_generation", "0.0")
    edit_cell(out / "judgments.csv", made_up[0]["qa_id"], "lost_in_retrieval", "1.0")
    assert run_cli("stats", "--out", str(out)).exit_code == 0
    (overall,) = [row for row in read_csv(out / "summary.csv") if row["document"] == "ALL"]
    assert float(overall["lost_in_retrieval"]) == 0.0  # every single question's chunk was found
    assert float(overall["lost_in_generation"]) > 0
    report = (out / "report.html").read_text(encoding="utf-8")
    assert "chunks: lost in retrieval" not in report and "in the retrieved chunks:" not in report
    assert "no chunk answers it: lost in generation (an answer made up)" in report


def test_a_split_exam_splits_its_harder_questions_too(env: FakeOpenAI, tmp_path: Path) -> None:
    args = ("--validation", "0.5", "--multi-hop", "6", "--unanswerable", "4")
    out = generate(env, tmp_path, world(repeats=set(), invents=set(), answered=set()), *args)
    harder = [row for row in read_csv(out / "qa_dataset.csv") if row["kind"] != "single"]
    assert len(harder) == 10 and {row["split"] for row in harder} == {"validation", "test"}
    assert run_cli("stats", "--out", str(out), "--split", "test").exit_code == 0


def test_a_harder_questions_key_points_are_held_as_a_single_questions_are() -> None:
    written = KeyedQA(question="Q?", answer="A.", key_points=["  one fact ", "two"])
    assert written.key_points == ["one fact", "two"]
    with pytest.raises(ValueError, match="a key point must not be blank"):
        KeyedQA(question="Q?", answer="A.", key_points=["one fact", "  "])  # re-asked


def test_an_embedding_not_the_stores_stops_unanswerable_questions_before_any_call(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Each candidate's question was written, and paid for, before its check met the embedding.
    the_world = world()
    env.responder = the_world.respond
    the_world.build_store(tmp_path / "store")
    size = len(the_world.records)
    env.embed = lambda text: hashed_embedding("another model " + text[::-1], size)
    command = ["generate", "--chroma", str(tmp_path / "store"), "--out", str(tmp_path / "run")]
    result = run_cli(*command, "--embedding", "openai:fake-embed", "--unanswerable", "2")
    assert result.exit_code == 2, result.output
    assert "are not the store's" in " ".join(result.output.split())
    assert env.count() == 0  # no chat call: not one question written


def test_the_control_runs_figures_add_up_with_unanswerable_questions_in_the_exam(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Made-up answers to the unanswerable questions pull the RAG run's completeness over every
    # question down; the control runs read the answerable ones: so does the RAG figure beside.
    guessing = world(answered=set(), guesses={"a.md", "b.md"})
    env.responder, env.embed = guessing.respond, guessing.embed
    guessing.build_store(tmp_path / "store")
    result = run_cli(
        "run", "--chroma", str(tmp_path / "store"), "--out", str(tmp_path / "run"),
        "--embedding", "openai:fake-embed", "--unanswerable", "4", "--control-runs",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    found = re.search(
        r"gold context ([\d.]+), RAG ([\d.]+), closed book [\d.]+; retrieval loss ([\d.-]+)", said
    )
    assert found is not None, said
    gold, rag, loss = (float(value) for value in found.groups())
    assert gold - rag == pytest.approx(loss, abs=0.011) and rag == 1.0  # the store answers all
    (overall,) = [
        row for row in read_csv(tmp_path / "run" / "summary.csv") if row["document"] == "ALL"
    ]
    assert float(overall["completeness_mean"]) < rag  # the made-up answers count there
    assert f"the retrieved chunks {rag:.0%}, of the answerable questions)" in said


def test_a_batched_command_goes_on_once_its_harder_questions_are_kept(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Refused before they are written (they take the sync road), the same command runs, and
    # batches the rest, once the exam holds them: the advice leads somewhere.
    out = generate(env, tmp_path, world(answered=set()), "--unanswerable", "2")
    calls = env.count()
    args = ("generate", "--chroma", str(tmp_path / "store"), "--out", str(out))
    batched = (*args, "--embedding", "openai:fake-embed", "--unanswerable", "2", "--batch")
    result = run_cli(*batched)
    assert result.exit_code == 0, result.output
    assert env.count() == calls and not env.batch_requests  # nothing left to write
    more = run_cli(*batched[:-3], "--unanswerable", "3", "--batch")
    assert more.exit_code == 2 and "sync road" in " ".join(more.output.split())


def test_a_dry_run_of_a_run_graded_with_the_context_counts_the_chunks_the_judge_reads(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    the_world = world()
    env.responder, env.embed = the_world.respond, the_world.embed
    the_world.build_store(tmp_path / "store")
    args = ("run", "--chroma", str(tmp_path / "store"), "--out", str(tmp_path / "run"))
    args += ("--embedding", "openai:fake-embed", "--controls", "0", "--dry-run")

    def judged_tokens(*more: str) -> int:
        result = run_cli(*args, *more)
        assert result.exit_code == 0, result.output  # it said the answers had no texts
        line = next(line for line in result.output.splitlines() if line.startswith("judge:"))
        return int(re.search(r"~([\d,]+) tokens in", line).group(1).replace(",", ""))  # type: ignore[union-attr]

    assert judged_tokens("--with-context") > judged_tokens() and env.count() == 0


def test_a_dry_run_of_a_run_counts_the_harder_questions_among_those_to_answer(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    clean = world(repeats=set(), invents=set(), answered=set())
    env.responder, env.embed = clean.respond, clean.embed
    clean.build_store(tmp_path / "store")
    args = ("run", "--chroma", str(tmp_path / "store"), "--out", str(tmp_path / "run"))
    args += ("--embedding", "openai:fake-embed", "--controls", "0")
    harder = ("--multi-hop", "2", "--unanswerable", "2")

    def to_answer(*more: str) -> str:
        result = run_cli(*args, *more, "--dry-run")
        assert result.exit_code == 0, result.output
        return next(line for line in result.output.splitlines() if line.startswith("answer:"))

    assert "answer: 12 rows to do" in to_answer(*harder)  # 8 chunks, and 4 harder questions
    assert run_cli("generate", *args[1:5], *args[5:7], *harder).exit_code == 0
    assert "answer: 12 rows to do" in to_answer(*harder)  # the exam's own, written
    assert "answer: 13 rows to do" in to_answer("--multi-hop", "3", "--unanswerable", "2")
