"""Benchmark `ragexam answer` against the fake server with a set latency per call.

    uv run python bench/bench_answer.py [--rows 1000] [--concurrency 32] [--latency 0.2]

It prints rows/s against the ceiling (concurrency / latency), and the retrieval time per
question with batched embedding calls and Chroma queries against one call per question,
measured in the same run (with no server latency, so only the overheads differ).
"""

from __future__ import annotations

import asyncio
import csv
import os
import tempfile
import time
from pathlib import Path

from common import FakeOpenAI, parse_args, print_rates, run_stage

BATCH = 64


def build(tmp: Path, server: FakeOpenAI, rows: int) -> tuple[Path, list[str]]:
    """A store whose persisted embedding function is the fake server, and a qa_dataset.csv."""
    import chromadb
    from chromadb.utils.embedding_functions import OpenAIEmbeddingFunction

    client = chromadb.PersistentClient(str(tmp / "store"))
    function = OpenAIEmbeddingFunction(
        model_name="fake-embed", api_key_env_var="OPENAI_API_KEY", api_base=server.base_url
    )
    collection = client.create_collection("bench", embedding_function=function)  # type: ignore[arg-type]
    texts = [f"Widget {i} weighs {3 * i} grams and ships from depot {i % 17}." for i in range(rows)]
    for start in range(0, rows, 500):
        collection.add(
            ids=[f"c{i}" for i in range(start, min(start + 500, rows))],
            documents=texts[start : start + 500],
        )
    questions = [f"How much does widget {i} weigh?" for i in range(rows)]
    (tmp / "run").mkdir()
    with (tmp / "run" / "qa_dataset.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status", "error"]
        )
        for i, question in enumerate(questions):
            writer.writerow([f"q{i}", f"c{i}", f"doc{i % 20}", question, "g", "ok", ""])
    return tmp / "store", questions


def retrieval_times(
    store: Path, questions: list[str], settings_env: dict[str, str]
) -> dict[str, float]:
    """Seconds per question: embeddings and Chroma queries, batched and one by one."""
    os.environ.update(settings_env)
    from ragexam.config import load_settings
    from ragexam.rag.embedders import OpenAIEmbedder
    from ragexam.store.chroma import StoreRef, open_collection

    collection = open_collection(StoreRef(path=store))
    embedder = OpenAIEmbedder(load_settings(None), "fake-embed")
    times: dict[str, float] = {}

    async def embed_both() -> list[list[float]]:
        for label, size in (("embed_batched", BATCH), ("embed_single", 1)):
            started, vectors = time.perf_counter(), []
            for start in range(0, len(questions), size):
                vectors += await embedder.embed(questions[start : start + size])
            times[label] = (time.perf_counter() - started) / len(questions)
        await embedder.aclose()
        return vectors

    vectors = asyncio.run(embed_both())
    for label, size in (("query_batched", BATCH), ("query_single", 1)):
        started = time.perf_counter()
        for start in range(0, len(vectors), size):
            collection.query(
                query_embeddings=vectors[start : start + size], n_results=5, include=["documents"]
            )
        times[label] = (time.perf_counter() - started) / len(questions)
    return times


def main() -> None:
    """Run the stage once, then the retrieval comparison, and print the figures."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as name, FakeOpenAI() as server:
        tmp = Path(name)
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        os.environ.update(env)
        store, questions = build(tmp, server, args.rows)
        server.latency = args.latency
        record = run_stage(
            {**os.environ, **env},
            tmp / "run",
            ["answer", "--chroma", str(store), "--concurrency", str(args.concurrency)],
        )
        server.latency = 0.0
        times = retrieval_times(store, questions, env)
    rate = float(record["rows_per_second"])
    print_rates("answer", args, rate, None)
    print("  retrieval per question (no server latency):")
    for kind in ("embed", "query"):
        batched, single = times[f"{kind}_batched"], times[f"{kind}_single"]
        print(
            f"    {kind}: batched {1000 * batched:.3f} ms, one by one {1000 * single:.3f} ms, "
            f"ratio {single / batched:.1f}x"
        )


if __name__ == "__main__":
    main()
