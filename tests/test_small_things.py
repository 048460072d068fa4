"""The smaller things a new user meets: no-op reruns, costs, headers, spinners, keys, warnings."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from rich.console import Console
from support import BASE, build_store, demo_run, docs, questions, rag_module, run_cli, write_run

from ragexam.cli import display


def test_a_rerun_with_nothing_to_do_says_so_in_one_line_per_stage(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(4))
    args = ("generate", "--chroma", str(store), "--out", "run")
    assert run_cli(*args).exit_code == 0
    again = run_cli(*args)
    assert again.exit_code == 0, again.output
    assert "generate: nothing to do (4 rows done before)" in again.output
    assert "0 ok, 0 errors" not in again.output and "tokens 0 in" not in again.output


def test_a_rag_stage_that_billed_nothing_asks_for_no_price(env: FakeOpenAI, tmp_path: Path) -> None:
    questions(tmp_path / "run", 3)
    spec = rag_module(tmp_path, "mine", "an answer")
    result = run_cli("answer", "--out", "run", "--rag", spec)
    assert result.exit_code == 0, result.output
    assert "RAGEXAM_PRICE" not in result.output and "cost: $0" in result.output


def test_compare_keeps_its_headers_whole_in_a_log(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE)
    b = write_run(tmp_path / "b", {qa_id: score + 0.25 for qa_id, score in BASE.items()})
    result = run_cli("compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    for header in ("document", "metric", "diff", "95% CI", "better/worse/same"):
        assert header in result.output, header


def test_the_stats_spinner_says_what_stats_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(display, "err", Console(file=screen, force_terminal=True, width=100))
    assert run_cli("stats", "--out", str(demo_run(tmp_path / "run"))).exit_code == 0
    shown = screen.getvalue()
    assert "stats: loading libraries, reading the run folder" in shown
    assert "store" not in shown and "endpoint" not in shown


def test_a_refused_key_names_the_variable_that_holds_it(tmp_path: Path) -> None:
    with FakeOpenAI(api_key="sk-the-right-one") as server:
        store = build_store(tmp_path / "store", docs(6))
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-a-wrong-one"}
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            patch.chdir(tmp_path)
            result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 4, result.output
    assert "check OPENAI_API_KEY" in " ".join(result.output.split())


def test_the_model_warning_is_said_once_per_run(env: FakeOpenAI, tmp_path: Path) -> None:
    env.quirks.models = ["the-only-model"]
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", docs(3))
    args = ("--chroma", str(store), "--out", "run", "--embedding", "openai:e", "--controls", "0")
    result = run_cli("run", *args)
    assert result.exit_code == 0, result.output
    assert result.output.count("is not among the models the endpoint lists") == 1


def test_each_error_reason_is_shown_whole(env: FakeOpenAI, tmp_path: Path) -> None:
    questions(tmp_path / "run", 2)
    reason = "the vector index of tenant acme is rebuilding after the nightly compaction " * 2
    (tmp_path / "failing.py").write_text(
        f"def answer(question):\n    raise RuntimeError({reason.strip()!r})\n", encoding="utf-8"
    )
    result = run_cli("answer", "--out", "run", "--rag", "failing:answer", "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    assert f"2 x the RAG callable raised RuntimeError: {reason.strip()}" in result.output


def test_a_file_given_for_a_folder_is_named_as_a_file(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(3))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder")
    chroma = run_cli("generate", "--chroma", str(a_file), "--out", "run")
    assert chroma.exit_code == 2
    assert chroma.output == f"Error: no Chroma store at {a_file}: a file, not a store's folder\n"
    for out in (a_file, a_file / "run"):
        result = run_cli("generate", "--chroma", str(store), "--out", str(out))
        assert result.exit_code == 2
        assert f"({a_file} is a file, not a folder); pass a writable --out" in result.output
    assert env.requests == []


def test_a_bad_setting_names_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEXAM_CONCURRENCY", "abc")
    result = run_cli("judge", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert result.output.startswith("Error: invalid setting: RAGEXAM_CONCURRENCY (environment")


def test_openais_own_base_url_still_needs_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    from support import exam

    exam(tmp_path / "run", 2)
    result = run_cli("judge", "--out", str(tmp_path / "run"), "--controls", "0")
    assert result.exit_code == 2
    assert result.output.startswith("Error: OPENAI_API_KEY is not set")


def test_a_base_url_set_empty_is_openais_for_every_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A `.env` line `OPENAI_BASE_URL=` is no URL: the SDK read it from the environment and
    # sent the embeddings to "" ("missing an 'http://' or 'https://' protocol").
    from ragexam.config import OPENAI_URL, Settings
    from ragexam.llm.batchapi import BatchApi
    from ragexam.llm.client import LLM
    from ragexam.rag.embedders import OpenAIEmbedder

    monkeypatch.setenv("OPENAI_BASE_URL", "")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.openai_base_url is None
    embedder = OpenAIEmbedder(settings, "text-embedding-3-small")
    assert str(embedder.client.async_client._client.base_url) == OPENAI_URL + "/"
    chat = LLM(settings, "gpt-4o-mini").chat.root_async_client
    assert str(chat.base_url) == OPENAI_URL + "/"
    assert str(BatchApi(settings).client.base_url) == OPENAI_URL + "/"
