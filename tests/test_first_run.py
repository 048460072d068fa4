"""A newcomer's first run: `.env` serves every component, and the sample loader fails in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_csv, run_cli
from openai_server import FakeOpenAI

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


def test_a_key_in_dotenv_serves_the_stored_embedding_function(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".env").write_text(
        f"OPENAI_API_KEY=sk-from-dotenv\nOPENAI_BASE_URL={env.base_url}\n", encoding="utf-8"
    )
    forget(monkeypatch, "OPENAI_API_KEY", "OPENAI_BASE_URL")
    loaded = load_corpus(tmp_path / "chroma", "--embedding", "openai:text-embedding-3-small")
    assert loaded.returncode == 0, loaded.stderr
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
