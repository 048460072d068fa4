"""Nothing secret or hostile leaks: URL credentials are masked, terminal escapes stripped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import build_store, closed_port, docs, make_store, questions, ranked_questions, run_cli

SECRET = "s3cr3t-Pa55"


def files_text(folder: Path) -> str:
    """Every file under a folder, as text."""
    return "\n".join(
        path.read_text(errors="replace") for path in folder.rglob("*") if path.is_file()
    )


def test_chroma_url_credentials_are_masked(env: FakeOpenAI, tmp_path: Path) -> None:
    url = f"http://admin:{SECRET}@127.0.0.1:{closed_port()}"
    result = run_cli("generate", "--chroma-url", url, "--out", "run")
    assert result.exit_code == 2
    assert result.output.startswith("Error: cannot reach the Chroma server at http://***@127.0.0.1")
    assert SECRET not in result.output


@pytest.mark.parametrize("name", ["api-key", "key", "token"])
def test_a_key_in_the_base_url_query_is_masked_everywhere(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    monkeypatch.setenv("OPENAI_BASE_URL", f"{env.base_url}?{name}={SECRET}")
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert SECRET not in result.output
    assert (tmp_path / "run" / "manifest.json").exists()
    assert SECRET not in files_text(tmp_path / "run")
    assert f"?{name}=***" in (tmp_path / "run" / "manifest.json").read_text()


HOSTILE_NAME = "doc\x1b]0;pwned\x07\x1b[2J\x9b31m.md"


def test_terminal_escapes_in_store_metadata_never_reach_the_terminal(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # room for the whole name: at 80 its start gives way
    chunks = docs(6)
    for chunk in chunks[:3]:
        chunk.metadata["source"] = HOSTILE_NAME
    store = build_store(tmp_path / "store", chunks)
    env.embedding_dim = 16  # the store's dimension
    ran = run_cli("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert ran.exit_code == 0, ran.output
    result = run_cli("stats", "--out", "run")
    assert result.exit_code == 0, result.output
    assert "doc?]0;pwned??[2J" in result.output  # each control character shown as ?
    assert not any((ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) <= 0x9F for c in result.output)


def test_a_store_that_names_another_host_never_gets_the_key(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAI() as stranger:
        store = make_store(tmp_path / "store", stranger)  # its function points at stranger
        ranked_questions(stranger, {f"Q{i}?": list(range(12)) for i in range(3)})
        host = stranger.base_url.removeprefix("http://").removesuffix("/v1")
        questions(tmp_path / "run", 3)
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        args = ["answer", "--chroma", str(store), "--out", "run"]
        refused = run_cli(*args)
        assert refused.exit_code == 2
        assert f"would send OPENAI_API_KEY to {host}, which is not" in refused.output
        assert "--trust-store-endpoint" in refused.output
        assert stranger.requests == [] and env.count() == 0
        trusted = run_cli(*args, "--trust-store-endpoint")
        assert trusted.exit_code == 0, trusted.output
        # Now, as asked, it embeds the questions (after a few stored chunks, to check them).
        assert stranger.count("/embeddings") == 2
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["answer"]["embedding_endpoint"] == f"http://{host}/v1"
