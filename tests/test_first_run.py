"""A newcomer's first run: `.env` serves every component, and the documented commands work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from support import build_store, docs, make_store, read_csv, run_cli, write_qa

import ragexam
from ragexam.io.csvfile import read_rows

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_corpus(store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run the sample loader in a subprocess, with embeddings from the endpoint."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "load_corpus.py"), "--chroma", str(store), *extra],
        env=dict(os.environ),
        capture_output=True,
        text=True,
    )


def forget(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset variables so that restoring them after the test also undoes what `.env` exported."""
    for name in names:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)


@pytest.mark.slow
def test_a_key_in_dotenv_serves_the_stored_embedding_function(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text(
        f"OPENAI_API_KEY=sk-from-dotenv\nOPENAI_BASE_URL={env.base_url}\n", encoding="utf-8"
    )
    forget(monkeypatch, "OPENAI_API_KEY", "OPENAI_BASE_URL")
    loaded = load_corpus(tmp_path / "chroma", "--embedding", "openai:text-embedding-3-small")
    assert loaded.returncode == 0, loaded.stderr
    # The Python API too, which lends .env's key to Chroma and leaves the environment as it was.
    ragexam.generate("chroma", out="api", limit=3)
    assert ragexam.answer("chroma", out="api").figures["rows_ok"] == 3
    assert "OPENAI_API_KEY" not in os.environ
    generated = run_cli("generate", "--chroma", "chroma", "--out", "run")
    assert generated.exit_code == 0, generated.output
    before = env.count("/embeddings")
    answered = run_cli("answer", "--chroma", "chroma", "--out", "run")
    assert answered.exit_code == 0, answered.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == 19 and {row["status"] for row in rows} == {"ok"}
    # The questions were embedded by Chroma's stored function, with the key from .env.
    embeds = [r for r in env.requests if r.path.endswith("/embeddings")][before:]
    assert embeds and {r.headers.get("authorization") for r in embeds} == {"Bearer sk-from-dotenv"}


@pytest.mark.slow
def test_the_loader_without_a_key_fails_in_one_line(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    loaded = load_corpus(tmp_path / "chroma", "--embedding", "openai:text-embedding-3-small")
    assert loaded.returncode == 1
    lines = loaded.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: OPENAI_API_KEY is not set"), lines
    assert env.requests == []


def test_judge_creates_a_new_out_folder_and_stats_finds_the_exam(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(6))
    env.embedding_dim = 16  # the store's dimension
    assert run_cli("generate", "--chroma", str(store), "--out", "base").exit_code == 0
    answered = run_cli("answer", "--chroma", str(store), "--out", "base", "--embedding", "openai:e")
    assert answered.exit_code == 0, answered.output
    judged = run_cli(
        "judge",
        "--qa-dataset",
        "base/qa_dataset.csv",
        "--answers",
        "base/answers.csv",
        "--out",
        "new/judge",
    )
    assert judged.exit_code == 0, judged.output
    assert len(read_csv(tmp_path / "new" / "judge" / "judgments.csv")) == 6
    # The judge recorded where its inputs came from, so the folder is complete for stats.
    summarised = run_cli("stats", "--out", "new/judge")
    assert summarised.exit_code == 0, summarised.output
    overall = read_rows(tmp_path / "new" / "judge" / "summary.csv", ["questions"])[0]
    assert overall["questions"] == "6" and overall["n_judged"] == "6"


@pytest.mark.slow
def test_bring_your_own_rag_as_documented(env: FakeOpenAI, tmp_path: Path) -> None:
    assert load_corpus(tmp_path / "chroma", "--embedding", "openai:fake-embed").returncode == 0
    assert run_cli("generate", "--chroma", "chroma").exit_code == 0
    assert run_cli("answer", "--chroma", "chroma").exit_code == 0
    assert run_cli("judge").exit_code == 0
    # The README's command, from the project folder, with the example module given as a file.
    mine = subprocess.run(
        [
            *(sys.executable, "-m", "ragexam.cli", "answer"),
            *("--rag", f"{EXAMPLES}/my_rag.py:answer", "--chroma", "chroma"),
            *("--qa-dataset", "outputs/qa_dataset.csv", "--out", "outputs/my"),
        ],
        env={**os.environ, "RAG_CHROMA": str(tmp_path / "chroma")},
        capture_output=True,
        text=True,
    )
    assert mine.returncode == 0, mine.stderr
    rows = read_csv(tmp_path / "outputs" / "my" / "answers.csv")
    assert len(rows) == 19 and {row["status"] for row in rows} == {"ok"}
    assert all(float(row["latency_s"]) > 0 for row in rows)
    assert not (tmp_path / "outputs" / "my" / "qa_dataset.csv").exists()
    assert run_cli("judge", "--out", "outputs/my").exit_code == 0
    assert run_cli("stats", "--out", "outputs/my").exit_code == 0
    compared = run_cli("compare", "outputs", "outputs/my")
    assert compared.exit_code == 0, compared.output
    assert (tmp_path / "outputs" / "my" / "comparison.csv").is_file()


LANGCHAIN_RAGS = """
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

def message(question):
    return AIMessage(content="a message about " + question)

def text_only(question):
    return AIMessage(content="text about " + question).text

def _retrieve(question):
    return [Document("Chunk text number 3.", id="c3"), Document("other", metadata={"id": "c1"})]

# Shaped like langchain's create_retrieval_chain: it takes {"input": ...}.
retrieval_chain = RunnablePassthrough.assign(
    context=(lambda x: x["input"]) | RunnableLambda(_retrieve)
).assign(answer=lambda x: AIMessage(content="chain answer"))

def legacy_qa(question):
    return {"result": "legacy answer", "source_documents": _retrieve(question)}

ASKED = []  # what the flaky chains were given

def _flaky(question):
    ASKED.append(question)
    if not isinstance(question, str):  # as a string chain's retriever fails on a mapping
        raise TypeError("expected a string")
    if question == "q0":
        raise ValueError("vector db shard down")  # as an output parser fails: a ValueError
    return {"answer": "an answer", "context": _retrieve(question)}

def _lenient(question):  # takes anything: a mapping as well as the string
    ASKED.append(question)
    if question == "q0":
        raise ValueError("vector db shard down")
    return {"answer": "an answer", "context": _retrieve(str(question))}

flaky, lenient = RunnableLambda(_flaky), RunnableLambda(_lenient)
"""


@pytest.mark.parametrize(
    ("target", "answer", "rank"),
    [("retrieval_chain", "chain answer", "1"), ("legacy_qa", "legacy answer", "1")],
)
def test_langchain_outputs_are_accepted(
    env: FakeOpenAI, tmp_path: Path, target: str, answer: str, rank: str
) -> None:
    (tmp_path / f"lc_{target}.py").write_text(LANGCHAIN_RAGS, encoding="utf-8")
    store = make_store(tmp_path / "store", env)
    write_qa(
        tmp_path / "run" / "qa_dataset.csv", [{"qa_id": "a", "chunk_id": "c3", "question": "q3"}]
    )
    result = run_cli(
        "answer", "--chroma", str(store), "--out", "run", "--rag", f"lc_{target}:{target}"
    )
    assert result.exit_code == 0, result.output
    [row] = read_csv(tmp_path / "run" / "answers.csv")
    assert row["status"] == "ok", row["error"]
    assert (row["answer"], row["target_rank"]) == (answer, rank)
    assert float(row["latency_s"]) >= 0 and row["latency_s"] != ""


@pytest.mark.parametrize("target", ["flaky", "lenient"])
def test_a_chain_that_fails_on_its_first_question_is_its_rows_error_or_said(
    env: FakeOpenAI, tmp_path: Path, target: str
) -> None:
    # Its first question is asked alone before the others: it failed, and its row asked it
    # again. A ValueError may be a mapping given to a chain that takes a string (LangChain
    # raises one), so the question goes again as a mapping: a chain that answers that way
    # (lenient) is asked so from then on, and the failure it hid is said.
    (tmp_path / f"lc_{target}.py").write_text(LANGCHAIN_RAGS, encoding="utf-8")
    store = make_store(tmp_path / "store", env)
    asked = [{"qa_id": f"a{i}", "chunk_id": "c3", "question": f"q{i}"} for i in range(3)]
    write_qa(tmp_path / "run" / "qa_dataset.csv", asked)
    args = ("answer", "--chroma", str(store), "--out", "run", "--rag", f"lc_{target}:{target}")
    result = run_cli(*args, "--max-error-rate", "1", "--concurrency", "1")
    assert result.exit_code == 0, result.output
    rows = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "answers.csv")}
    assert [rows[f"a{i}"]["status"] for i in (1, 2)] == ["ok", "ok"]
    mappings = [{key: "q0"} for key in ("input", "question", "query")]
    given = sys.modules[f"lc_{target}"].ASKED
    said = " ".join(result.output.split())
    if target == "flaky":
        assert rows["a0"]["error"] == "the RAG callable raised ValueError: vector db shard down"
        assert given == ["q0", *mappings, "q1", "q2"]
        assert "Warning" not in said
    else:
        assert rows["a0"]["status"] == "ok"
        assert given == ["q0", *({"input": f"q{i}"} for i in range(3))]
        assert (
            "Warning: the RAG chain raised ValueError (vector db shard down) when given the "
            "question as a string, and answered it as {'input': question}: every question "
            "goes to it so"
        ) in said


@pytest.mark.parametrize(
    ("target", "shape"),
    [("message", "langchain_core.messages.ai.AIMessage"), ("text_only", "TextAccessor")],
)
def test_an_answer_alone_stops_the_stage_saying_what_came_back(
    env: FakeOpenAI, tmp_path: Path, target: str, shape: str
) -> None:
    (tmp_path / f"lc_{target}.py").write_text(LANGCHAIN_RAGS, encoding="utf-8")
    store = make_store(tmp_path / "store", env)
    write_qa(
        tmp_path / "run" / "qa_dataset.csv",
        [{"qa_id": f"q{i}", "chunk_id": "c3", "question": f"q{i}"} for i in range(5)],
    )
    result = run_cli(
        "answer", "--chroma", str(store), "--out", "run", "--rag", f"lc_{target}:{target}"
    )
    assert result.exit_code == 2, result.output
    assert shape in result.output and "no retrieved chunks" in result.output
    assert read_csv(tmp_path / "run" / "answers.csv") == []  # no row scored as a miss


def test_chunks_without_a_document_key_stop_before_any_call(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    chunks = [
        Document(f"Fact {i}.", metadata={"url": f"https://kb.example/{i % 2}", "n": i}, id=f"c{i}")
        for i in range(4)
    ]
    store = build_store(tmp_path / "store", chunks)
    refused = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert refused.exit_code != 0
    line = refused.output.strip()
    assert len(line.splitlines()) == 1 and "(unknown)" in line
    assert "fields present: n, url" in line and "--doc-key url" in line
    assert env.requests == []
    accepted = run_cli("generate", "--chroma", str(store), "--out", "run", "--doc-key", "url")
    assert accepted.exit_code == 0, accepted.output
    documents = {row["document"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert documents == {"https://kb.example/0", "https://kb.example/1"}


def test_answers_record_the_texts_the_answerer_saw(env: FakeOpenAI, tmp_path: Path) -> None:
    texts = {f"c{i}": f"Chunk {i} says: " + f"fact {i} " * 40 for i in range(6)}
    chunks = [Document(text, metadata={"source": "a.md"}, id=cid) for cid, text in texts.items()]
    store = build_store(tmp_path / "store", chunks)
    env.embedding_dim = 16
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    args = ["answer", "--chroma", str(store), "--embedding", "openai:e", "--k", "3"]
    result = run_cli(*args, "--out", "run", "--max-chunk-chars", "120")
    assert result.exit_code == 0, result.output
    questions = {row["qa_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    for row in read_csv(tmp_path / "run" / "answers.csv"):
        ids = json.loads(row["retrieved_ids"])
        assert len(ids) == 3
        assert json.loads(row["retrieved_texts"]) == [texts[cid][:120] for cid in ids]
        assert row["source_text"] == texts[questions[row["qa_id"]]["chunk_id"]][:120]
    (tmp_path / "bare").mkdir()
    shutil.copy(tmp_path / "run" / "qa_dataset.csv", tmp_path / "bare")
    bare = run_cli(*args, "--out", "bare", "--no-texts")
    assert bare.exit_code == 0, bare.output
    header = (tmp_path / "bare" / "answers.csv").read_text(encoding="utf-8").splitlines()[0]
    assert "retrieved_ids" in header and "retrieved_texts" not in header
    # --no-texts on a file written with them resumes it: its rows keep their texts, and the
    # rows made now leave them empty (it was refused as "other columns than this version")
    answers = (tmp_path / "run" / "answers.csv").read_text(encoding="utf-8").splitlines()
    kept, dropped = answers[:-2], answers[-2:]
    (tmp_path / "run" / "answers.csv").write_text("\n".join(kept) + "\n", encoding="utf-8")
    resumed = run_cli(*args, "--out", "run", "--max-chunk-chars", "120", "--no-texts")
    assert resumed.exit_code == 0, resumed.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == len(answers) - 1
    redone = {row["qa_id"] for row in rows[-2:]}
    assert redone == {line.split(",", 1)[0] for line in dropped}
    assert all(row["retrieved_texts"] == "" for row in rows[-2:])
    assert all(json.loads(row["retrieved_texts"]) for row in rows[:-2])
