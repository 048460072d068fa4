"""The HTTP stack under the SDK, at both ends of the declared openai range (.ci/run runs this
file again in a venv with openai 2.45.0, which speaks httpx where 3.x speaks httpx2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from openai_server import FakeOpenAI
from support import build_store, docs, read_csv, run_cli

HTTPX2_FROM = (2, 47)  # the first openai that takes an httpx2 client


def installed() -> tuple[int, int]:
    major, minor = openai.__version__.split(".")[:2]
    return int(major), int(minor)


def test_every_stage_calls_through_whichever_openai_is_installed(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(6))
    env.embedding_dim = 16
    result = run_cli("run", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 0, result.output
    for name in ("qa_dataset", "answers", "judgments"):
        rows = read_csv(tmp_path / "run" / f"{name}.csv")
        assert rows and {row["status"] for row in rows} == {"ok"}, name
    stages = json.loads((tmp_path / "run" / "manifest.json").read_text())["stages"]
    expected = "aiohttp" if installed() >= HTTPX2_FROM else f"openai {openai.__version__}'s own"
    assert stages["generate"]["http_client"].startswith(expected), stages["generate"]


def test_a_failure_inside_the_http_client_is_not_blamed_on_the_endpoint(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def mismatched(response: Any) -> None:
        raise TypeError("Expected an instance of httpx.Response, got httpx2.Response")

    monkeypatch.setattr("ragexam.llm.client.check_reply", mismatched)
    store = build_store(tmp_path / "store", docs(40))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "inside ragexam" in said and "not the endpoint" in said and "TypeError" in said
    assert f"openai {openai.__version__}" in said
    assert "OPENAI_BASE_URL" not in said and "cannot connect" not in said
    assert env.count() <= 16  # the calls in flight when the first failed, not 40 rows' retries


def test_the_batch_road_writes_requests_where_the_sdk_lets_it_and_says_why_where_not(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # The batch road takes each request at the transport, which needs an httpx2 client.
    store = build_store(tmp_path / "store", docs(3))
    args = ("generate", "--chroma", str(store), "--out", "run", "--batch-dir", "files")
    result = run_cli(*args)
    said = " ".join(result.output.split())
    if installed() >= HTTPX2_FROM:
        assert result.exit_code == 75, result.output  # the requests wait for their results
        assert len(list((tmp_path / "files" / "requests").glob("*.jsonl"))) == 1
    else:
        assert result.exit_code == 2, result.output
        assert f"openai {openai.__version__}" in said and "openai>=2.47" in said
        assert not (tmp_path / "files").exists()
    assert env.count() == 0  # never a paid call: neither road was taken by mistake
