"""`--chroma-url` against a Chroma server that requires a token, with a tenant and a database.

`chroma run` (Chroma's Rust server) has no token authentication to turn on, so the server here
is Chroma's own Python server (`chromadb.app`, with fastapi) and Chroma's own token
authentication provider: the closest real setup Chroma offers offline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import chromadb
import pytest
from chromadb.config import Settings
from openai_server import FakeOpenAI
from support import free_port, read_csv, run_cli

TOKEN = "chroma-tok-3f9a1c77"
PROVIDERS = "chromadb.auth.token_authn"
N = 12


def seed(url: str) -> None:
    """Tenant `acme`, database `handbooks`, collection `handbook` of N chunks with 16-d vectors."""
    port = int(url.rsplit(":", 1)[1])
    auth = {
        "chroma_client_auth_provider": f"{PROVIDERS}.TokenAuthClientProvider",
        "chroma_client_auth_credentials": TOKEN,
        "anonymized_telemetry": False,
    }
    admin = chromadb.AdminClient(
        Settings(
            chroma_api_impl="chromadb.api.fastapi.FastAPI",
            chroma_server_host="127.0.0.1",
            chroma_server_http_port=port,
            **auth,
        )
    )
    admin.create_tenant("acme")
    admin.create_database("handbooks", tenant="acme")
    client = chromadb.HttpClient(
        host="127.0.0.1", port=port, tenant="acme", database="handbooks", settings=Settings(**auth)
    )
    collection = client.create_collection("handbook", embedding_function=None)
    collection.add(
        ids=[f"c{i}" for i in range(N)],
        documents=[f"Rule {i}: widget {i} weighs {i} grams." for i in range(N)],
        embeddings=[[1.0 if j == i else 0.0 for j in range(16)] for i in range(N)],
        metadatas=[{"source": f"doc{i % 3}.md"} for i in range(N)],
    )


pytestmark = pytest.mark.slow  # a Chroma server of its own, started once for the module


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Chroma's server with token authentication on 127.0.0.1; yields its URL."""
    port = free_port()
    env = {
        **os.environ,
        "CHROMA_SERVER_AUTHN_PROVIDER": f"{PROVIDERS}.TokenAuthenticationServerProvider",
        "CHROMA_SERVER_AUTHN_CREDENTIALS": TOKEN,
        "IS_PERSISTENT": "TRUE",
        "PERSIST_DIRECTORY": str(tmp_path_factory.mktemp("secured") / "db"),
        "ANONYMIZED_TELEMETRY": "FALSE",
    }
    args = ["-m", "uvicorn", "chromadb.app:app", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        seed(url)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_token_tenant_and_database_reach_the_collection(
    env: FakeOpenAI, tmp_path: Path, secured_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.embedding_dim = 16
    monkeypatch.setenv("CHROMA_API_KEY", TOKEN)
    monkeypatch.setenv("CHROMA_TENANT", "acme")  # from the environment, or from the flag below
    store = ["--chroma-url", secured_server, "--chroma-database", "handbooks"]
    generated = run_cli("generate", *store, "--out", "run")
    assert generated.exit_code == 0, generated.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["chunk_id"] for row in rows} == {f"c{i}" for i in range(N)}
    answered = run_cli("answer", *store, "--out", "run", "--embedding", "openai:e", "--k", "3")
    assert answered.exit_code == 0, answered.output
    answers = read_csv(tmp_path / "run" / "answers.csv")
    assert len(answers) == N and {row["status"] for row in answers} == {"ok"}
    env.embedding_dim = 8  # the wrong model: caught before any chat call, as with a local store
    before = env.count()
    wrong = run_cli(
        "answer",
        *store,
        "--qa-dataset",
        "run/qa_dataset.csv",
        "--out",
        "other",
        "--embedding",
        "openai:e",
    )
    assert wrong.exit_code == 2 and "dimension 8" in wrong.output and "dimension 16" in wrong.output
    assert env.count() == before
    written = [path.read_text(encoding="utf-8") for path in (tmp_path / "run").iterdir()]
    assert written and not any(TOKEN in text for text in written)
    assert TOKEN not in generated.output + answered.output


@pytest.mark.parametrize("token", [None, "wrong-token-123"])
def test_a_missing_or_wrong_token_is_one_line_and_no_call(
    env: FakeOpenAI,
    secured_server: str,
    monkeypatch: pytest.MonkeyPatch,
    token: str | None,
) -> None:
    if token:
        monkeypatch.setenv("CHROMA_API_KEY", token)
    args = [
        "--chroma-url",
        secured_server,
        "--chroma-tenant",
        "acme",
        "--chroma-database",
        "handbooks",
    ]
    result = run_cli("generate", *args)
    assert result.exit_code == 4  # refused, like an endpoint that refuses its key
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the Chroma server at"), lines
    assert ("check CHROMA_API_KEY" if token else "set CHROMA_API_KEY") in lines[0]
    assert token is None or token not in result.output
    assert env.requests == []
