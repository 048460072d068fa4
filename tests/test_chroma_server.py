"""`--chroma-url`: the same stages against a real Chroma server on 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import build_store, read_csv, run_cli
from openai_server import FakeOpenAI
from test_generate import docs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


SERVERS: dict[str, subprocess.Popen[bytes]] = {}  # the chroma_server processes, by URL


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[str]:
    """`chroma run` serving a store of 30 chunks; yields its URL."""
    store = build_store(tmp_path / "served", docs(30))
    port = free_port()
    chroma = Path(sys.executable).with_name("chroma")
    if not chroma.exists():
        chroma = Path(shutil.which("chroma") or "chroma")
    server = subprocess.Popen(
        [str(chroma), "run", "--path", str(store), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    SERVERS[url] = server
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        SERVERS.pop(url, None)
        server.terminate()
        server.wait(timeout=10)


def test_generate_through_a_chroma_server(
    env: FakeOpenAI, tmp_path: Path, chroma_server: str
) -> None:
    result = run_cli("generate", "--chroma-url", chroma_server, "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 30 and {row["status"] for row in rows} == {"ok"}
    assert {row["chunk_id"] for row in rows} == {f"chunk-{i:04d}" for i in range(30)}
    wrong = run_cli("generate", "--chroma-url", chroma_server, "--collection", "nope")
    assert wrong.exit_code == 2 and "'nope'" in wrong.output and "handbook" in wrong.output


def test_an_unreachable_server_is_one_line_and_no_call(env: FakeOpenAI) -> None:
    result = run_cli("generate", "--chroma-url", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2
    assert result.output.startswith("Error: cannot reach the Chroma server")
    assert len(result.output.strip().splitlines()) == 1
    assert env.requests == []
