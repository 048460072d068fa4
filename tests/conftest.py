"""Shared pytest fixtures for the ragexam test suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chromadb
import pytest
from chromadb.api.client import SharedSystemClient
from click.testing import Result
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from openai_server import FakeOpenAI
from typer.testing import CliRunner

from ragexam.cli.app import app
from ragexam.io.csvfile import scan
from ragexam.io.rowlog import RowLog

# -- fake OpenAI server ---------------------------------------------------------------------------
# A fresh server per test: it costs about a millisecond and no knob or request log can leak.


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI (defaults: no latency, no faults, no API key check)."""
    with FakeOpenAI() as server:
        yield server


# -- other fixtures -------------------------------------------------------------------------------


@pytest.fixture
def env(fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    """Point ragexam at the fake server, in an empty working directory with no stray settings."""
    for name in list(os.environ):
        if name.startswith(("RAGEXAM_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no developer's .env is read
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    monkeypatch.setenv("RAGEXAM_RETRY_BACKOFF", "0.01")
    monkeypatch.setenv("RAGEXAM_TIMEOUT", "10")
    return fake_llm


def build_store(path: Path, docs: list[Document], collection: str = "handbook") -> Path:
    """A persisted store made the way users make theirs: LangChain's Chroma.from_documents."""
    Chroma.from_documents(
        docs,
        DeterministicFakeEmbedding(size=16),
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
