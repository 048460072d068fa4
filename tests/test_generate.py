"""`ragexam generate` end to end: real Chroma stores, the real client stack, the fake server."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI, Faults, Reply
from support import build_store, docs, read_csv, run_cli

from ragexam.stages.generate import qa_id_for


def test_one_ok_row_per_chunk_with_its_id_and_document(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(200))
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 200
    assert {row["status"] for row in rows} == {"ok"}
    assert len({row["qa_id"] for row in rows}) == 200
    expected = {f"chunk-{i:04d}": f"doc{i % 5}.md" for i in range(200)}
    assert {row["chunk_id"]: row["document"] for row in rows} == expected
    assert all(row["qa_id"] == qa_id_for(row["chunk_id"]) for row in rows)
    assert all(row["question"] and row["ground_truth_answer"] for row in rows)
    assert env.count() == 200


@pytest.mark.slow
def test_rate_limits_and_server_errors_are_retried_within_budget(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(200))
    env.faults = Faults(rate_429=0.20, rate_500=0.05, retry_after="0", max_faults_per_body=2)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "3")
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 200 and {row["status"] for row in rows} == {"ok"}
    faults = [r.fault for r in env.requests if r.fault]
    assert faults.count("429") > 10 and faults.count("500") > 0  # the faults really happened
    assert env.count() <= 200 * (3 + 1)
    assert env.count() == 200 + len(faults)  # every fault cost exactly one more call
    assert sum(int(row["attempts"]) for row in rows) == env.count()


def test_malformed_json_on_one_chunk_is_an_error_row_only_there(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    chunks = docs(40)
    chunks[7].page_content = "POISON chunk that always gets broken JSON back."
    store = build_store(tmp_path / "store", chunks)
    env.faults = Faults(malformed_if=lambda text: "POISON" in text)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output  # 1 of 40 is under the 5% default
    rows = {row["chunk_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    bad = rows.pop("chunk-0007")
    assert bad["status"] == "error"
    assert "JSON" in bad["error"] and bad["question"] == "" and bad["ground_truth_answer"] == ""
    assert bad["raw_reply"]  # the broken reply is kept for the user to see
    assert {row["status"] for row in rows.values()} == {"ok"}


def test_too_many_errors_exit_nonzero_and_a_rerun_retries_them(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(20))
    env.faults = Faults(malformed_if=lambda text: "widget 1" in text)  # 1, 10..19: 11 rows
    first = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert first.exit_code == 1
    assert "11 of 20 rows" in first.output and "--max-error-rate" in first.output
    env.faults = Faults()
    calls_before = env.count()
    second = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert second.exit_code == 0, second.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 20 and {row["status"] for row in rows} == {"ok"}
    assert env.count() - calls_before == 11  # only the error rows were asked again


def test_limit_empty_and_long_chunks(env: FakeOpenAI, tmp_path: Path) -> None:
    chunks = docs(10)
    chunks[0].page_content = "   \n\t "
    chunks[1].page_content = "long " * 500
    store = build_store(tmp_path / "store", chunks)
    result = run_cli(
        "generate",
        "--chroma",
        str(store),
        "--out",
        "run",
        "--limit",
        "4",
        "--max-chunk-chars",
        "1000",
        "--max-error-rate",
        "0.5",
    )
    assert result.exit_code == 0, result.output
    rows = {row["chunk_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert len(rows) == 4
    assert rows["chunk-0000"]["status"] == "error" and "empty" in rows["chunk-0000"]["error"]
    assert rows["chunk-0001"]["truncated"] == "true"
    assert rows["chunk-0001"]["chunk_chars"] == "2500"
    assert rows["chunk-0002"]["truncated"] == "false"
    assert env.count() == 3  # the empty chunk cost no call
    sent = "".join(json.dumps(r.body) for r in env.requests)  # any order: calls run at once
    assert "long " * 200 in sent and "long " * 201 not in sent  # 1000 chars = 200 x "long "


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode", "prompt"])
def test_every_structured_output_method(env: FakeOpenAI, tmp_path: Path, method: str) -> None:
    store = build_store(tmp_path / "store", docs(5))
    result = run_cli(
        "generate", "--chroma", str(store), "--out", "run", "--structured-output", method
    )
    assert result.exit_code == 0, result.output
    assert {row["status"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")} == {"ok"}
    body = env.requests[0].body
    assert ("tools" in body) == (method == "function_calling")
    kind = body.get("response_format", {}).get("type")
    assert kind == {"json_schema": "json_schema", "json_mode": "json_object"}.get(method)


def test_unsupported_method_falls_back_once(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(30))

    def no_json_schema(body: dict[str, object]) -> Reply | None:
        if str(body.get("response_format", {})).count("json_schema"):
            return Reply(status=400, error_message="response_format json_schema is unsupported")
        return None

    env.responder = no_json_schema
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--concurrency", "1")
    assert result.exit_code == 0, result.output
    assert {row["status"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")} == {"ok"}
    assert env.count() == 31  # one refused call, then function calling for all
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["structured_output"] == "function_calling"


def test_formula_quotes_newlines_and_unicode_survive_the_csv(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    texts = [
        '=HYPERLINK("http://x")',
        "+1+2",
        "-5 degrees",
        "@SUM(A1)",
        "'=already",
        'He said "yes", then\nleft.',
        "naïve café — 東京 🚀",
        "\tTabbed\r\nline",
    ]
    chunks = [
        Document(page_content=text, metadata={"source": text[:6]}, id=f"{text[:3]}-{i}")
        for i, text in enumerate(texts)
    ]
    store = build_store(tmp_path / "store", chunks)

    def echo(body: dict[str, Any]) -> Reply:
        user = body["messages"][-1]["content"]
        text = user.split("<chunk>\n", 1)[1].split("\n</chunk>", 1)[0]
        written = {"question": text, "answer": text + " (answer)", "key_points": [text]}
        return Reply(content=json.dumps(written))

    env.responder = echo
    result = run_cli(
        "generate", "--chroma", str(store), "--out", "run", "--structured-output", "json_mode"
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "run" / "qa_dataset.csv"
    rows = {row["chunk_id"]: row for row in read_csv(path)}
    for i, text in enumerate(texts):
        row = rows[f"{text[:3]}-{i}"]
        assert row["status"] == "ok", row
        assert row["question"] == text.strip()
        assert row["document"] == text[:6]
    with path.open(newline="", encoding="utf-8") as handle:
        cells = [cell for record in csv.reader(handle) for cell in record]
    assert not [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]


@pytest.mark.slow
def test_a_hung_call_times_out_and_is_retried(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(6))
    env.faults = Faults(rate_hang=1.0, hang_seconds=30, max_faults_per_body=1)  # first call hangs
    monkeypatch.setenv("RAGEXAM_TIMEOUT", "1")
    started = time.monotonic()
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 20  # nowhere near the 30 s hang
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["status"] for row in rows} == {"ok"}
    assert {row["attempts"] for row in rows} == {"2"}
    assert [r.fault for r in env.requests].count("hang") == 6


def test_a_404_is_not_retried(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(30))
    env.faults = Faults(status_if=lambda text: 404 if "widget 3 " in text else None)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = {row["chunk_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert rows["chunk-0003"]["status"] == "error"
    assert rows["chunk-0003"]["attempts"] == "1" and "HTTP 404" in rows["chunk-0003"]["error"]
    assert env.count() == 30


def test_403s_among_calls_that_succeed_are_error_rows_not_a_refused_key(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # Three 403s over a stage whose other calls all succeeded stopped it as "the endpoint
    # refused the API key" (exit 4): the refusals were counted, never reset by a success.
    store = build_store(tmp_path / "store", docs(8))
    refused = ("widget 1 ", "widget 3 ", "widget 5 ", "widget 7 ")
    env.faults = Faults(status_if=lambda text: 403 if any(w in text for w in refused) else None)
    args = ("generate", "--chroma", str(store), "--out", "run", "--concurrency", "1")
    result = run_cli(*args, "--max-error-rate", "1")
    assert result.exit_code == 0, result.output
    rows = {row["chunk_id"]: row for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    failed = {key for key, row in rows.items() if row["status"] == "error"}
    assert failed == {f"chunk-000{i}" for i in (1, 3, 5, 7)}
    assert all(
        rows[key]["error"].startswith("the endpoint refused the call: HTTP 403") for key in failed
    )
    assert "API key" not in rows["chunk-0001"]["error"]


def test_too_many_error_rows_name_the_commonest_reason(env: FakeOpenAI, tmp_path: Path) -> None:
    blank = [Document(page_content=" ", metadata={"source": "blank.md"}, id="chunk-blank")]
    store = build_store(tmp_path / "store", docs(5) + blank)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "1 of 6 rows (16.7%) ended in error" in said
    assert "most often (1): the chunk is empty or whitespace only" in said
    assert "need their input fixed, or --max-error-rate to go on" in said
