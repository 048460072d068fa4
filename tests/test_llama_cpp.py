"""Optional: `ragexam run` against a real llama-cpp-python server (`python -m llama_cpp.server`).

Skipped unless the `llama_cpp` package is installed and RAGEXAM_TEST_GGUF names a GGUF model
file; so never part of the default run. The README says how to run it. Query embeddings come
from the test server (llama.cpp would need a pooling embedding model); every chat call goes to
llama.cpp, whose server refuses json_schema with HTTP 500 and reads only `max_tokens`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import build_store, docs, read_csv, run_cli

GGUF = os.environ.get("RAGEXAM_TEST_GGUF", "")
STARTUP_SECONDS = 300
ALIAS = "local-gguf"  # the name the server answers to: ragexam is told it, and warns of no other


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator[str]:
    """A llama.cpp server on a free port; its OpenAI base URL."""
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed")
    if not Path(GGUF).is_file():
        pytest.skip("RAGEXAM_TEST_GGUF does not name a GGUF model file")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "llama_cpp.server", "--model", GGUF, "--port", str(port)]
    command += ["--host", "127.0.0.1", "--n_ctx", "4096", "--model_alias", ALIAS]
    if os.environ.get("RAGEXAM_TEST_CHAT_FORMAT"):  # e.g. gemma, whose template drops system
        command += ["--chat_format", os.environ["RAGEXAM_TEST_CHAT_FORMAT"]]
    with (tmp_path / "llama.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield _wait_for(f"http://127.0.0.1:{port}/v1", server)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_for(base_url: str, server: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=5):
                return base_url
        except OSError:
            time.sleep(1)
    pytest.fail(f"llama_cpp.server did not start within {STARTUP_SECONDS}s")


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a real model on the CPU, after up to STARTUP_SECONDS of loading
def test_ragexam_run_against_llama_cpp(
    env: FakeOpenAI, llama_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", llama_server)
    monkeypatch.setenv("RAGEXAM_EMBEDDING_BASE_URL", env.base_url)
    monkeypatch.setenv("RAGEXAM_MODEL", ALIAS)
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", "0")  # a local server costs nothing a token
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", "0")
    monkeypatch.setenv("RAGEXAM_SYSTEM_PROMPT", "user")
    # No RAGEXAM_TIMEOUT nor RAGEXAM_MAX_TOKENS: replies are bounded by what each stage's
    # schema needs, and calls are given the time the server measurably takes.
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(2))
    args = ["--chroma", str(store), "--out", "run", "--concurrency", "1"]
    started = time.monotonic()
    result = run_cli("run", *args, "--embedding", "openai:e", "--max-error-rate", "1")
    minutes = (time.monotonic() - started) / 60
    assert result.exit_code == 0, result.output
    assert "is not among the models" not in result.output and "gpt-4o-mini" not in result.output
    stages = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]
    assert stages["generate"]["structured_output"] != "json_schema"  # refused with a 500
    counts = {}
    for name in ("qa_dataset", "answers", "judgments", "judge_controls"):
        rows = read_csv(tmp_path / "run" / f"{name}.csv")
        counts[name] = f"{sum(row['status'] == 'ok' for row in rows)}/{len(rows)} ok"
        for row in rows:
            assert "HTTP" not in row["error"] and "timed out" not in row["error"], row
            assert row["status"] == "ok" or int(row["prompt_tokens"] or 0) > 0, row
    print(f"llama.cpp run: {counts}, {minutes:.1f} minutes")
