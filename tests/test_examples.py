"""The sample corpus loads into a Chroma store with one command, and generate runs on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import extractive
import pytest
from openai_server import FakeOpenAI
from support import read_csv, run_cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_load_corpus_then_generate(env: FakeOpenAI, tmp_path: Path) -> None:
    store = tmp_path / "chroma"
    loaded = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "load_corpus.py"),
            "--chroma",
            str(store),
            "--embedding",
            "openai:text-embedding-3-small",
        ],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "19 chunks from 4 documents" in loaded.stdout
    assert env.count("/embeddings") >= 1
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert len(rows) == 19 and {row["status"] for row in rows} == {"ok"}
    assert {row["document"] for row in rows} == {
        "account.md",
        "returns-policy.md",
        "shipping.md",
        "warranty.md",
    }


@pytest.mark.slow
def test_the_sample_corpus_gets_verified_harder_questions(env: FakeOpenAI, tmp_path: Path) -> None:
    store = tmp_path / "chroma"
    load = [sys.executable, str(EXAMPLES / "load_corpus.py"), "--chroma", str(store)]
    subprocess.run([*load, "--embedding", "openai:fake-embed"], env=dict(os.environ), check=True)
    env.responder = extractive.respond  # models that copy sentences, as a literal model would
    result = run_cli(
        "generate", "--chroma", str(store), "--out", "run", "--multi-hop", "3",
        "--unanswerable", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    texts = {row["chunk_id"]: row for row in rows if row["kind"] == "single"}
    pairs = [row for row in rows if row["kind"] == "multi-hop"]
    assert len(pairs) == 3 and sum(row["kind"] == "unanswerable" for row in rows) == 2
    for row in pairs:
        first, second = json.loads(row["chunk_ids"])
        # Its key points are the first sentence of each chunk: one from each.
        points = json.loads(row["key_points"])
        assert points == [texts[first]["ground_truth_answer"], texts[second]["ground_truth_answer"]]
    assert "multi-hop: kept 3 of 3 asked" in result.output
