"""Environment errors are one-line errors saying what to do (exit 2, or 4 for an endpoint)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from openai_server import FakeOpenAI, Faults
from support import (
    build_store,
    closed_port,
    docs,
    exam,
    make_store,
    questions,
    rag_module,
    ranked_questions,
    run_cli,
)


def one_line_error(result: object, code: int, *words: str) -> None:
    """The command failed with `code` and one `Error:` line holding every word."""
    output = getattr(result, "output", "")
    assert getattr(result, "exit_code", None) == code, output
    assert output.startswith("Error: ") and output.count("\n") == 1, output
    assert "Internal error" not in output
    for word in words:
        assert word in output, (word, output)


def test_out_that_is_a_file(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(3))
    (tmp_path / "taken").write_text("not a folder")
    result = run_cli("generate", "--chroma", str(store), "--out", "taken")
    one_line_error(result, 2, "taken", "--out")
    assert env.count() == 0


def test_qa_dataset_that_is_a_folder(env: FakeOpenAI, tmp_path: Path) -> None:
    (tmp_path / "run" / "qa_dataset.csv").mkdir(parents=True)
    rag = rag_module(tmp_path, "folder_rag", "A.")
    one_line_error(run_cli("answer", "--out", "run", "--rag", rag), 2, "is a folder")
    one_line_error(run_cli("judge", "--out", "run"), 2, "is a folder")


@pytest.mark.parametrize("url", ["http://[::1", "127.0.0.1:8000", "http://host:port"])
def test_a_malformed_openai_base_url(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    store = build_store(tmp_path / "store", docs(3))
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    one_line_error(result, 2, "OPENAI_BASE_URL")


@pytest.mark.parametrize("url", ["http://[::1", "http://host:port", "ftp:/nothing"])
def test_a_malformed_chroma_url(env: FakeOpenAI, tmp_path: Path, url: str) -> None:
    result = run_cli("generate", "--chroma-url", url, "--out", "run")
    one_line_error(result, 2, "--chroma-url")


@pytest.mark.parametrize("code", ["model_not_found", None], ids=["openai", "vllm-words"])
def test_a_model_the_endpoint_does_not_serve_is_named_not_the_url(
    env: FakeOpenAI, tmp_path: Path, code: str | None
) -> None:
    # OpenAI answers an unknown model 404 model_not_found (vLLM in words alone): the URL is
    # right, and the error said "no chat completions at that URL", pointing at the endpoint
    env.quirks.serves = frozenset({"gpt-4o-mini"})
    env.quirks.unknown_model_code = code
    store = build_store(tmp_path / "store", docs(3))
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--model", "gpt-5-nope")
    one_line_error(result, 2, "serves no model 'gpt-5-nope'", "--model")
    assert "at that URL" not in result.output
    assert env.count() < 3  # stopped at the first reply: every call would fail alike


def test_a_wrong_urls_404_page_that_says_model_and_not_found_is_still_the_url() -> None:
    # a 404 page of a web app whose menu says "Models", at a wrong URL: not a model error
    import httpx2
    import openai

    from ragexam.llm.endpoint import no_such_model

    request = httpx2.Request("POST", "http://127.0.0.1:1/chat/completions")
    page = "<html><nav>Models</nav><h1>404 Not Found</h1></html>"
    response = httpx2.Response(404, request=request, text=page)
    exc = openai.NotFoundError(page, response=response, body=None)
    assert not no_such_model(exc, "gpt-4o-mini")
    said = "The model `gpt-5-nope` does not exist."
    named = openai.NotFoundError(said, response=response, body={"message": said})
    assert no_such_model(named, "gpt-5-nope")


@pytest.mark.parametrize(
    "text", ["[1, 2]", '{"stages": null}', '{"stages": {"answer": null}}', '{"stages": [1]}']
)
def test_a_manifest_that_is_not_an_object(env: FakeOpenAI, tmp_path: Path, text: str) -> None:
    store = build_store(tmp_path / "store", docs(3))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text(text)
    exam(tmp_path / "run", 2)  # for judge, who reads it first
    for command in (("generate", "--chroma", str(store)), ("judge", "--controls", "0")):
        result = run_cli(*command, "--out", "run")
        one_line_error(result, 2, "manifest.json", "not a JSON object")
    assert env.count() == 0 and (tmp_path / "run" / "manifest.json").read_text() == text


@pytest.mark.parametrize("status", [None, 401, 400, 500])
def test_an_embedding_endpoint_that_fails_the_preflight(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int | None
) -> None:
    store = make_store(tmp_path / "store", env)
    ranked_questions(env, {})  # the chunks embed as stored: the check of the store passes
    questions(tmp_path / "run")
    if status is None:
        monkeypatch.setenv("RAGEXAM_EMBEDDING_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    else:
        env.faults = Faults(status_if=lambda text: status if "Q" in text else None)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    args = ["answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:emb"]
    result = run_cli(*args)
    one_line_error(result, 4, "embedding endpoint")
    assert env.count() == 0  # no chat call was paid for


def test_a_line_of_env_that_cannot_be_parsed_is_said_once_naming_the_file(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text("RAGEXAM_CONCURRENCY=2\nthis is not a setting\n")
    exam(tmp_path / "run", 2)
    command = [sys.executable, "-m", "ragexam.cli", "judge", "--out", "run", "--controls", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    said = "could not parse statement starting at line 2 (in the .env file)"
    assert done.stderr.count("could not parse statement") == 1 and said in done.stderr
