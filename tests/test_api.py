"""The Python API: `import ragexam`, each command a function, inside a running loop too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda
from openai_server import FakeOpenAI
from support import build_store, docs

import ragexam


def my_rag(question: str) -> tuple[str, list[str]]:
    """A RAG system that always retrieves chunk-0001 then chunk-0000."""
    return f"answer to {question}", ["chunk-0001", "chunk-0000"]


def test_every_command_as_a_function(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(8))
    exam = ragexam.generate(store, limit=6)
    assert exam.path == Path("outputs/qa_dataset.csv") and exam.figures["rows_ok"] == 6
    questions = exam.frame()
    assert len(questions) == 6 and set(questions["status"]) == {"ok"}
    answers = ragexam.answer(store, rag=my_rag)
    frame = answers.frame()
    assert answers.figures["rows_ok"] == 6 and set(frame["rag"]) == {"test_api:my_rag"}
    expected = {"chunk-0000": 2.0, "chunk-0001": 1.0}  # the rank my_rag gives each source
    ranks = dict(zip(questions["qa_id"], questions["chunk_id"].map(expected), strict=True))
    for qa_id, rank in zip(frame["qa_id"], frame["target_rank"], strict=True):
        assert rank == ranks[qa_id] or (pd_isna(rank) and pd_isna(ranks[qa_id]))
    graded = ragexam.judge(samples=2, scale="ten")
    assert set(graded.frame()["samples"]) == {2} and set(graded.frame()["scale"]) == {"ten"}
    # Four known-answer controls for each of the 6 questions (fewer than the 10 asked for).
    assert len(graded.frame("controls")) == 8 * 6 and graded.figures["controls"]["rows_ok"] == 48
    report = ragexam.stats()
    assert report.paths["report"].is_file() and report.figures["questions"] == 6
    hits = sum(rank in (1.0, 2.0) for rank in ranks.values())
    assert report.figures["hit_rate"] == pytest.approx(hits / 6)
    assert len(report.frame("summary")) == 1
    again = ragexam.answer(store, rag=my_rag, out="second", qa_dataset="outputs/qa_dataset.csv")
    assert again.figures["rows_ok"] == 6
    ragexam.judge(out="second")
    compared = ragexam.compare("outputs", "second")
    assert compared.path == Path("second/comparison.csv") and not compared.frame().empty
    template = ragexam.calibrate(template=4)
    labels = template.frame()
    assert len(labels) == 4 and set(labels["qa_id"]) <= set(questions["qa_id"])
    graded_by_judge = graded.frame().set_index("qa_id")["completeness"]
    labels["completeness"] = [graded_by_judge[qa_id] for qa_id in labels["qa_id"]]  # agrees
    labels.to_csv(tmp_path / "labels.csv", index=False)
    calibration = ragexam.calibrate(tmp_path / "labels.csv")
    row = calibration.frame().set_index("metric").loc["completeness"]
    assert row["n"] == 4 and row["mae"] == pytest.approx(0.0)


def pd_isna(value: object) -> bool:
    """True for a missing rank (NaN)."""
    return value != value


def test_run_inside_a_running_event_loop_with_a_runnable(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(5))
    chain = RunnableLambda(
        lambda question: {"answer": "yes", "context": [Document("x", id="chunk-0002")]}
    )

    async def notebook_cell() -> ragexam.Result:
        return ragexam.run(store, limit=3, rag=chain, samples=2, seed=7)

    result = asyncio.run(notebook_cell())
    assert set(result.paths) >= {"qa_dataset", "answers", "judgments", "summary", "report"}
    assert result.figures["answer"]["rows_ok"] == 3
    assert len(result.frame("judgments")) == 3
    assert set(result.frame("judgments")["samples"]) == {2}
    assert list(result.frame("answers")["answer"]) == ["yes"] * 3


def test_run_refuses_an_option_no_stage_takes(env: FakeOpenAI, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"sampels.*did you mean 'samples'"):
        ragexam.run(tmp_path, sampels=2)


def test_the_figures_are_plain_values_and_run_frames_the_summary(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(4))
    result = ragexam.run(store, rag=my_rag, controls=0)
    summary = result.frame()  # summary_by_document.csv, as stats().frame(): not the exam
    assert "completeness_mean" in summary and "question" not in summary
    json.dumps(result.figures["stats"])  # numpy scalars would be refused
    assert type(result.figures["stats"]["questions"]) is int


def test_a_session_shared_by_calls_reads_one_copy_of_the_store(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(4))
    notes: list[str] = []

    class Noting(ragexam.Observer):
        def note(self, text: str) -> None:
            notes.append(text)

    with ragexam.Session(observer=Noting()) as session:
        ragexam.generate(store, session=session)
        ragexam.answer(store, rag=my_rag, session=session)
        copies = list(session.snapshots._made.values())
    assert len(copies) == 1 and sum("reading a snapshot" in note for note in notes) == 1
    assert not copies[0].path.exists()  # removed when the session closed


def test_ctrl_c_in_a_notebook_stops_the_run_and_the_next_call_goes_on(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    """A kernel's interrupt reaches the cell's thread, not the worker that runs the stages:
    it used to surface only once answer, judge and stats had run to their end, every call
    paid for (38 calls where 9 were made when it came)."""
    import signal
    import threading
    import time

    store = build_store(tmp_path / "store", docs(10))
    env.latency = 0.2
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main  # the signal is this thread's

    def interrupt_once_generating() -> None:
        while env.count() < 3:
            time.sleep(0.01)
        sent.append(env.count())
        signal.pthread_kill(main, signal.SIGINT)

    async def notebook_cell() -> ragexam.Result:
        return ragexam.run(store, out="nb", rag=my_rag, controls=0, concurrency=2)

    sent: list[int] = []
    # Ctrl-C handled, as a kernel has it, even in a test run started with `&` (it ignores it)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_generating, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(notebook_cell())
    finally:
        signal.signal(signal.SIGINT, before)
    calls = env.count()
    assert calls <= sent[0] + 2  # the calls in flight, and none begun after
    assert not (tmp_path / "nb" / "answers.csv").exists()  # no later stage began
    manifest = json.loads((tmp_path / "nb" / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["status"] == "interrupted"
    env.latency = 0.0
    result = ragexam.run(store, out="nb", rag=my_rag, controls=0)  # the next call goes on
    generated = result.figures["generate"]
    assert generated["rows_done_before"] >= 1 and generated["rows_ok"] >= 1
    assert generated["rows_ok"] + generated["rows_done_before"] == 10


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("limit", "3", "limit='3' is not a whole number"),  # was '<' not supported
        ("force", "false", "force='false' is not True or False"),  # was True: rows redone
        ("dry_run", "no", "dry_run='no' is not True or False"),  # was a dry run
        ("k", 2.5, "k=2.5 is not a whole number"),
        ("limit", True, "limit=True is not a whole number"),
        ("fail_under", 0.7, "fail_under=0.7 is not a text"),  # was AttributeError
        ("out", 123, "out=123 is not a path"),
        ("max_error_rate", "0.5", "max_error_rate='0.5' is not a number"),  # went through
        ("concurrency", 1.5, "concurrency=1.5 is not a whole number"),  # blamed the .env
    ],
)
def test_an_option_of_the_wrong_type_is_refused_naming_it_before_anything_runs(
    env: FakeOpenAI, tmp_path: Path, option: str, value: object, said: str
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    with pytest.raises(TypeError) as refused:
        ragexam.run(store, rag=my_rag, **{option: value})
    assert str(refused.value) == said
    assert env.count() == 0 and not (tmp_path / "outputs").exists()


def test_numbers_where_numbers_go_are_taken_as_they_are(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(3))
    result = ragexam.run(store, rag=my_rag, controls=0, max_error_rate=1, rag_timeout=30)
    assert result.figures["judge"]["rows_ok"] == 3


def test_the_api_leaves_the_environment_as_it_was(tmp_path: Path) -> None:
    """threadpoolctl's import, on the first stats, set KMP_DUPLICATE_LIB_OK=True in the
    caller's process (OpenMP's check against two runtimes, off for the notebook's torch)."""
    import subprocess
    import sys

    from support import ANSWER_HEADER, JUDGE_HEADER, QA_HEADER, write_csv

    run = tmp_path / "run"
    run.mkdir()
    write_csv(run / "qa_dataset.csv", QA_HEADER, [["q", "c", "D", "Q?", "T", "ok", ""]])
    write_csv(run / "answers.csv", ANSWER_HEADER, [["q", "A", '["c"]', 1, "ok", ""]])
    write_csv(run / "judgments.csv", JUDGE_HEADER, [["q", 1.0, 1.0, "ok", ""]])
    script = (
        "import os, sys, ragexam; before = dict(os.environ); ragexam.stats(out=sys.argv[1]); "
        "print(sorted(set(os.environ.items()) ^ set(before.items())))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(run)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_a_dry_runs_result_says_it_wrote_nothing(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(3))
    dry = ragexam.run(store, rag=my_rag, dry_run=True)
    assert dry.paths == {} and dry.figures["calls"] > 0
    with pytest.raises(ValueError, match="wrote no file"):  # was a bare StopIteration
        _ = dry.path
    report = ragexam.run(store, rag=my_rag, controls=0)
    with pytest.raises(ValueError, match=r"report\.html is no CSV file"):  # was a ParserError
        report.frame("report")


def test_the_package_says_it_is_typed() -> None:
    import importlib.resources

    assert importlib.resources.files("ragexam").joinpath("py.typed").is_file()
