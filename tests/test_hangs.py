"""Nothing hangs: a stalled Chroma server or a stuck --rag callable ends in an error, and one
Ctrl-C ends the run at once."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import SERVERS, questions, read_csv, run_cli, write_qa


@pytest.mark.slow
def test_a_chroma_server_that_never_answers_is_a_one_line_error(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_STORE_TIMEOUT", "1")
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = run_cli("generate", "--chroma-url", url, "--out", "run")
        took = time.monotonic() - started
    assert result.exit_code == 2
    assert result.output == (
        f"Error: the Chroma store at {url} did not answer to a connection within 1s; "
        "check that it is up, or raise RAGEXAM_STORE_TIMEOUT\n"
    )
    assert took < 10 and env.count() == 0


SLEEPY_RAG = """
import time
from pathlib import Path

def answer(question):
    if question == "Q1?":
        Path("stuck").write_text("called")
        time.sleep(120)
    return "An answer.", ["c0"]
"""


# The commonest mistake of an async RAG: a sync call inside its `async def`. It blocked
# ragexam's own event loop: no deadline could fire (a 20 s call was an ok row, its latency
# queued), and Ctrl-C or SIGTERM could not stop the run.
BLOCKING_RAG = """
import time
from pathlib import Path

async def answer(question):
    if question == "Q1?":
        Path("stuck").write_text("called")
        time.sleep(SECONDS)
    return "An answer.", ["c0"]
"""


def test_an_async_rag_that_blocks_is_held_to_its_deadline(env: FakeOpenAI, tmp_path: Path) -> None:
    questions(tmp_path / "run", 4)
    (tmp_path / "blocking_rag.py").write_text(BLOCKING_RAG.replace("SECONDS", "4"))
    started = time.monotonic()
    args = ("answer", "--out", "run", "--rag", "blocking_rag:answer", "--rag-timeout", "1")
    result = run_cli(*args, "--max-error-rate", "1", "--concurrency", "1")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 30
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "answers.csv")}
    assert rows["q0"]["status"] == "ok"
    assert rows["q1"]["error"] == "the RAG callable did not answer within 1s (--rag-timeout)"
    assert all(float(row["latency_s"]) < 1 for row in rows.values() if row["status"] == "ok")
    # the questions after it waited on the same blocked loop: in time, or error rows too
    assert all(row["status"] in ("ok", "error") for row in rows.values()) and len(rows) == 4


def test_a_stuck_rag_call_times_out_into_an_error_row(env: FakeOpenAI, tmp_path: Path) -> None:
    questions(tmp_path / "run", 4)
    (tmp_path / "sleepy_rag.py").write_text(SLEEPY_RAG)
    started = time.monotonic()
    result = run_cli(
        "answer",
        "--out",
        "run",
        "--rag",
        "sleepy_rag:answer",
        "--rag-timeout",
        "1",
        "--max-error-rate",
        "0.5",
    )
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 30
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "answers.csv")}
    assert rows["q1"]["status"] == "error"
    assert rows["q1"]["error"] == "the RAG callable did not answer within 1s (--rag-timeout)"
    assert {rows[q]["status"] for q in ("q0", "q2", "q3")} == {"ok"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["def", "blocking async def"])
def test_one_ctrl_c_ends_a_run_stuck_in_a_rag_call(
    env: FakeOpenAI, tmp_path: Path, kind: str
) -> None:
    questions(tmp_path / "run", 4)
    rag = SLEEPY_RAG if kind == "def" else BLOCKING_RAG.replace("SECONDS", "120")
    (tmp_path / "sleepy_rag2.py").write_text(rag)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ragexam.cli",
            "answer",
            "--out",
            "run",
            "--rag",
            "sleepy_rag2:answer",
            "--rag-timeout",
            "100",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "stuck").exists():
        time.sleep(0.05)
    time.sleep(0.5)  # the other rows land
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        code = process.wait(timeout=20)
    finally:
        process.kill()  # only if it hung: then the test has failed already
    assert code == 130 and time.monotonic() - sent < 5
    assert process.stderr is not None and "Interrupted" in process.stderr.read()
    rows = {row["qa_id"]: row["status"] for row in read_csv(tmp_path / "run" / "answers.csv")}
    # every finished row is kept (those after a blocking call wait on its loop: unfinished)
    assert rows == ({"q0": "ok", "q2": "ok", "q3": "ok"} if kind == "def" else {"q0": "ok"})


@pytest.mark.slow
def test_a_chroma_server_that_stalls_during_answer_is_a_one_line_error(
    env: FakeOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chroma_server: str,
) -> None:
    monkeypatch.setenv("RAGEXAM_STORE_TIMEOUT", "2")
    env.embedding_dim = 16  # the served store's dimension
    rows = [
        {"qa_id": f"q{i}", "chunk_id": f"chunk-{i % 30:04d}", "question": f"Q{i}?"}
        for i in range(300)
    ]
    write_qa(tmp_path / "run" / "qa_dataset.csv", rows)
    server = SERVERS[chroma_server]

    def stall_the_store(body: dict[str, object]) -> None:  # at the first chat call
        server.send_signal(signal.SIGSTOP)  # connections still open, nothing answers

    env.responder = stall_the_store
    started = time.monotonic()
    try:
        result = run_cli(
            "answer", "--chroma-url", chroma_server, "--out", "run", "--embedding", "openai:e"
        )
    finally:
        server.send_signal(signal.SIGCONT)
    assert time.monotonic() - started < 60
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: the Chroma store at {chroma_server} did not answer to ")
    assert last.endswith("within 2s; check that it is up, or raise RAGEXAM_STORE_TIMEOUT")
    assert len(read_csv(tmp_path / "run" / "answers.csv")) > 0  # rows done before are kept
