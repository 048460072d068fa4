"""Builders the tests share: stores, exams, run folders, hand-written CSVs, servers."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import chromadb
from chromadb.api.client import SharedSystemClient
from chromadb.utils.embedding_functions import OpenAIEmbeddingFunction
from click.testing import Result
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from openai_server import FakeOpenAI, Reply, hashed_embedding
from typer.testing import CliRunner

from ragexam.cli.app import app
from ragexam.io.csvfile import read_rows, scan
from ragexam.io.rowlog import RowLog

N_CHUNKS = 12

SERVERS: dict[str, subprocess.Popen[bytes]] = {}  # conftest's chroma_server processes, by URL


def axis(i: int, dim: int = N_CHUNKS) -> list[float]:
    """Chunk i's vector: the i-th unit vector, so distances are set by the query's weights."""
    return [1.0 if j == i else 0.0 for j in range(dim)]


def make_store(path: Path, server: FakeOpenAI, duplicate_of: dict[int, int] | None = None) -> Path:
    """A store whose persisted embedding function is OpenAI-compatible, at the fake server."""
    client = chromadb.PersistentClient(str(path))
    function = OpenAIEmbeddingFunction(
        model_name="fake-embed", api_key_env_var="OPENAI_API_KEY", api_base=server.base_url
    )
    collection = client.create_collection("kbase", embedding_function=function)  # type: ignore[arg-type]
    texts = [f"Chunk text number {i}." for i in range(N_CHUNKS)]
    for copy, original in (duplicate_of or {}).items():
        texts[copy] = texts[original]
    collection.add(
        ids=[f"c{i}" for i in range(N_CHUNKS)],
        documents=texts,
        embeddings=[axis(i) for i in range(N_CHUNKS)],
        metadatas=[{"source": f"doc{i % 3}.md"} for i in range(N_CHUNKS)],
    )
    SharedSystemClient.clear_system_cache()
    return path


def write_qa(path: Path, rows: list[dict[str, str]]) -> Path:
    """A hand-written qa_dataset.csv with the contract's columns."""
    columns = [
        "qa_id",
        "chunk_id",
        "document",
        "question",
        "ground_truth_answer",
        "status",
        "error",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {"document": "d", "ground_truth_answer": "g", "status": "ok", "error": "", **row}
            )
    return path


def ranked_questions(server: FakeOpenAI, orders: dict[str, list[int]]) -> None:
    """Make question text q embed so that chunks come back in the order `orders[q]`."""
    vectors = {q: [0.0] * N_CHUNKS for q in orders}
    for question, order in orders.items():
        for place, chunk in enumerate(order):
            vectors[question][chunk] = 1.0 - place / (2 * N_CHUNKS)
    # The chunks embed as they are stored: ragexam checks that before the first question.
    vectors |= {f"Chunk text number {i}.": axis(i) for i in range(N_CHUNKS)}
    server.embed = lambda text: vectors[text]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


QA_HEADER = ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status", "error"]
ANSWER_HEADER = ["qa_id", "answer", "retrieved_ids", "target_rank", "status", "error"]
JUDGE_HEADER = ["qa_id", "completeness", "conciseness", "status", "error"]
# Twelve questions in each of two documents; completeness 0, 0.25 or 0.5 in run A.
IDS = [f"{doc}{i}" for doc in "ab" for i in range(12)]
BASE = {qa_id: (i % 3) * 0.25 for i, qa_id in enumerate(IDS)}


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> None:
    """A hand-written CSV: the contract's columns only."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_run(folder: Path, completeness: dict[str, float | None], extra: str = "") -> Path:
    """A run with the contract's columns; a None score is a judge error row."""
    folder.mkdir()
    ids = [*IDS, extra] if extra else IDS
    qa = [[qa_id, f"c-{qa_id}", f"doc {qa_id[0].upper()}", "q", "t", "ok", ""] for qa_id in ids]
    write_csv(folder / "qa_dataset.csv", QA_HEADER, qa)
    ranks = [[qa_id, "x", "[]", [1, 2, ""][len(qa_id) % 3], "ok", ""] for qa_id in ids]
    write_csv(folder / "answers.csv", ANSWER_HEADER, ranks)
    judged = [
        [qa_id, "", "", "error", "bad JSON"] if score is None else [qa_id, score, 0.5, "ok", ""]
        for qa_id, score in completeness.items()
    ]
    write_csv(folder / "judgments.csv", JUDGE_HEADER, judged)
    return folder


def rows(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    return {(row["document"], row["metric"]): row for row in read_rows(path, ["metric"])}


def gpt_like_tokens(text: str) -> int:
    """Bill as GPT tokenizers roughly do on English: each word, number or punctuation mark.

    (GPT's pre-tokenizer splits text this way, and common English words are one token.)
    The estimate under test counts characters and words instead, so it cannot just agree.
    """
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


N = 6


def rag_module(folder: Path, name: str, answer: str) -> str:
    """A --rag module in the working directory whose callable always gives `answer`."""
    (folder / f"{name}.py").write_text(
        f"def answer(question):\n    return {answer!r}, ['c0']\n", encoding="utf-8"
    )
    return f"{name}:answer"


def questions(run: Path, n: int = N) -> Path:
    """A hand-made exam of n questions."""
    rows = [{"qa_id": f"q{i}", "chunk_id": f"c{i}", "question": f"Q{i}?"} for i in range(n)]
    return write_qa(run / "qa_dataset.csv", rows)


_HELD: list[socket.socket] = []  # the closed ports' sockets, bound for the whole test run


def closed_port() -> int:
    """A local port nothing listens on, nor will: its socket stays bound, never listening (a
    connection is refused), so that no server another test starts meanwhile can take it (one
    did, and answered a test of an unreachable endpoint with a page)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    _HELD.append(probe)
    return int(probe.getsockname()[1])


def docs(n: int, prefix: str = "Fact") -> list[Document]:
    """n chunks over five source documents."""
    return [
        Document(
            page_content=f"{prefix} {i}: widget {i} weighs {3 * i} grams.",
            metadata={"source": f"doc{i % 5}.md", "n": i},
            id=f"chunk-{i:04d}",
        )
        for i in range(n)
    ]


def write_dict_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """A hand-written CSV with the columns of the first row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def exam(run: Path, n: int, answers: dict[int, str] | None = None) -> None:
    """qa_dataset.csv and answers.csv for n questions; answers in reverse order."""
    write_dict_rows(
        run / "qa_dataset.csv",
        [
            {
                "qa_id": f"q{i}",
                "chunk_id": f"c{i}",
                "document": f"doc{i % 4}",
                "question": f"Question #{i}?",
                "ground_truth_answer": f"Truth #{i}.",
                "status": "ok",
                "error": "",
            }
            for i in range(n)
        ],
    )
    write_dict_rows(
        run / "answers.csv",
        [
            {
                "qa_id": f"q{i}",
                "answer": (answers or {}).get(i, f"Answer #{i}."),
                "retrieved_ids": "[]",
                "target_rank": "1",
                "status": "ok",
                "error": "",
            }
            for i in reversed(range(n))
        ],
    )


def grade(body: dict[str, Any], completeness: float, conciseness: float = 0.5) -> Reply:
    """A reply in the form the request asked for (json_schema by default)."""
    return Reply(
        content=json.dumps(
            {"reasoning": "checked", "completeness": completeness, "conciseness": conciseness}
        )
    )


def user_text(body: dict[str, Any]) -> str:
    """The exam's user message (a re-ask appends more messages after it)."""
    return str(next(m["content"] for m in body["messages"] if m["role"] == "user"))


def number(body: dict[str, Any], label: str) -> int:
    return int(re.search(rf"{label} #(\d+)", user_text(body)).group(1))  # type: ignore[union-attr]


# The server's limit, scaled down in time so a test takes seconds, not minutes: 60 calls per
# 4 s is 900 calls a minute. Every claim below is a ratio to it, so the scale cancels out.
LIMIT, WINDOW = 60, 4.0
RATE = LIMIT / WINDOW  # calls per second
ROWS = 400
CHROMIUM = Path("/usr/bin/chromium")
# The flags this machine needs, and none that fetch anything.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = "<script>alert(1)</script>"
HOSTILE_IMAGE = "<img src=x onerror=alert(2)>"
# document -> (chance the source chunk is retrieved, completeness when it is, when it is not,
# conciseness): one profile per diagnosis
PROFILES = {
    "handbook/remote-work-policy.md": (0.4, 0.7, 0.1, 0.8),
    "handbook/expenses-and-travel.md": (0.95, 0.4, 0.2, 0.8),
    "handbook/security/incident-response-runbook.md": (0.9, 0.9, 0.5, 0.3),
    "handbook/onboarding.md": (0.95, 0.95, 0.5, 0.9),
    "handbook/benefits/parental-leave.md": (0.85, 0.85, 0.3, 0.75),
    "handbook/code-of-conduct.md": (0.6, 0.8, 0.2, 0.7),
    HOSTILE: (0.5, 0.3, 0.0, 0.5),
}


def demo_run(folder: Path) -> Path:
    """Seven documents, one per profile, with hostile text in a document, question and answer."""
    rng = random.Random(11)
    qa, answers, judgments = [], [], []
    for number, (document, (hit, good, bad, concise)) in enumerate(PROFILES.items()):
        for index in range(rng.randint(8, 30)):
            qa_id = f"d{number}q{index}"
            question = HOSTILE if document == HOSTILE else f"What does section {index} say?"
            qa.append([qa_id, f"c{qa_id}", document, question, f"{HOSTILE_IMAGE} truth", "ok", ""])
            rank = rng.randint(1, 5) if rng.random() < hit else ""
            answer = f"{HOSTILE} answer" if document == HOSTILE else "It says so."
            answers.append([qa_id, answer, "[]", rank, "ok", ""])
            mean = good if rank else bad
            score = [min(1, max(0, round(rng.gauss(m, 0.15), 1))) for m in (mean, concise)]
            judgments.append([qa_id, *score, "ok", ""])
    folder.mkdir()
    common = ["status", "error"]
    qa_header = ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", *common]
    write_csv(folder / "qa_dataset.csv", qa_header, qa)
    write_csv(
        folder / "answers.csv",
        ["qa_id", "answer", "retrieved_ids", "target_rank", *common],
        answers,
    )
    write_csv(
        folder / "judgments.csv", ["qa_id", "completeness", "conciseness", *common], judgments
    )
    return folder


def hashes(folder: Path) -> dict[str, bytes]:
    """Every file of a folder with its bytes' hash."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).digest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


class Hashed(Embeddings):
    """LangChain embeddings with the test server's vectors (`env.embedding_dim = dim`)."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [hashed_embedding(text, self.dim) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return hashed_embedding(text, self.dim)


def build_store(path: Path, docs: list[Document], collection: str = "handbook") -> Path:
    """A persisted store made the way users make theirs: LangChain's Chroma.from_documents,
    with vectors as the test server embeds (dim 16)."""
    Chroma.from_documents(
        docs,
        Hashed(16),
        persist_directory=str(path),
        collection_name=collection,
    )
    SharedSystemClient.clear_system_cache()  # Chroma allows one client per path per process
    return path


def snapshot(path: Path) -> dict[str, Any]:
    """Every collection and record of a store, to prove a command changed nothing."""
    SharedSystemClient.clear_system_cache()  # drop the client the command under test opened
    client = chromadb.PersistentClient(path=str(path))
    state = {}
    for collection in client.list_collections():
        records = collection.get(include=["documents", "metadatas", "embeddings"])
        state[collection.name] = (
            records["ids"],
            records["documents"],
            records["metadatas"],
            [list(map(float, vector)) for vector in records["embeddings"]],
        )
    SharedSystemClient.clear_system_cache()
    return state


def run_cli(*args: str) -> Result:
    """Run `ragexam ARGS` in-process, the way a user runs it."""
    return CliRunner().invoke(app, list(args))


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of an output CSV as ragexam reads them back when it resumes (repairs a torn tail)."""
    records, _ = scan(path.read_bytes())
    return RowLog(path, records[0].fields).load()


def kill_midway(args: list[str], output: Path, lines: int) -> None:
    """Run `ragexam ARGS` in a process and SIGKILL it once `output` holds `lines` lines."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ragexam.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _lines(output) < lines:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def exam_row(
    qa_id: str, document: str, kind: str, chunks: list[str], question: str
) -> dict[str, str]:
    """A qa_dataset.csv row of a question of a kind, made from these chunks (none: unanswerable)."""
    return {
        "qa_id": qa_id,
        "chunk_id": chunks[0] if chunks else "",
        "kind": kind,
        "chunk_ids": json.dumps(chunks),
        "document": document,
        "question": question,
        "ground_truth_answer": "T",
        "status": "ok",
        "error": "",
    }


def marked_exam(run: Path, rows: list[dict[str, Any]]) -> Path:
    """qa_dataset.csv (with a key_points column when a row has some) and answers.csv, from
    rows of qa_id, document, question, truth, answer and, optionally, key_points (a list)."""
    qa = [
        {
            "qa_id": row["qa_id"],
            "chunk_id": f"c-{row['qa_id']}",
            "document": row.get("document", "doc"),
            "question": row["question"],
            "ground_truth_answer": row["truth"],
            **({"key_points": json.dumps(row["key_points"])} if "key_points" in row else {}),
            "status": "ok",
            "error": "",
        }
        for row in rows
    ]
    write_dict_rows(run / "qa_dataset.csv", qa)
    answers = [
        {"qa_id": row["qa_id"], "answer": row["answer"], "retrieved_ids": "[]",
         "target_rank": "1", "status": "ok", "error": ""}
        for row in rows
    ]  # fmt: skip
    write_dict_rows(run / "answers.csv", answers)
    return run


def edit_cell(path: Path, qa_id: str, column: str, value: str, key: str = "qa_id") -> None:
    """Change one cell of a CSV, as a person would in a spreadsheet."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header, rows = list(reader.fieldnames or []), list(reader)
    for row in rows:
        if row[key] == qa_id:
            row[column] = value
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, header)
        writer.writeheader()
        writer.writerows(rows)


def open_page(browser: Any, width: int, height: int) -> Any:
    """A new page of this size, in the `browser` fixture's Chromium."""
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    return page


# -- the batch road -------------------------------------------------------------------------------


def run_batch_files(
    server: FakeOpenAI, folder: Path, shape: str = "openai", skip: frozenset[str] = frozenset()
) -> int:
    """Do what `vllm run-batch` does to each request file of a --batch-dir: answer every line
    (through the server's sync chat path) into DIR/results/ under the same name, in OpenAI's
    or vLLM's output shape. Returns the lines answered; custom_ids in `skip` get no result."""
    from batch_api import batch_output_line, vllm_body

    results = folder / "results"  # made by ragexam: vLLM makes no folder for its output
    answered = 0
    for path in sorted((folder / "requests").glob("*.jsonl")):
        lines = []
        for text in path.read_text(encoding="utf-8").splitlines():
            request = json.loads(text)
            if request["custom_id"] in skip:
                continue
            record, reply = server.answer_line(request["url"], request["body"])
            body = vllm_body(reply) if shape == "vllm" and record.status == 200 else reply
            lines.append(
                batch_output_line(
                    request["custom_id"], body, status_code=record.status, shape=shape
                )  # type: ignore[arg-type]
            )
            answered += 1
        (results / path.name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return answered


def ledger_events(path: Path) -> list[dict[str, Any]]:
    """The events of a batch ledger."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def wait_until(condition: Any, seconds: float = 20.0) -> None:
    """Poll `condition()` until it is true, or fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def start_cli(*args: str) -> subprocess.Popen[bytes]:
    """`ragexam ARGS` in a process of its own, its output kept."""
    return subprocess.Popen(
        [sys.executable, "-m", "ragexam.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def custom_key(custom_id: str) -> str:
    """The row key of one of ragexam's custom_ids (TAG~CALL~DIGEST~KEY)."""
    return custom_id.split("~", 3)[3]
