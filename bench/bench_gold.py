"""Benchmark `ragexam answer --context gold`: how much of the stage's wall time goes to store reads.

    uv run python bench/bench_gold.py [--rows 10000] [--concurrency 32] [--latency 0.2]

The gold-context answerer reads each question's source chunk from the store, one Chroma call
per batch of questions, ahead of the workers. It prints the time spent in those reads as a
share of the stage's wall time (target <= 10%), and the time per question of batched reads
against one read per question, measured in the same run.
"""

from __future__ import annotations

import csv
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common import FakeOpenAI, parse_args, print_rates

import ragexam
from ragexam.rag import base as rag_base

BATCH = 64


def build(tmp: Path, rows: int) -> Path:
    """A store of `rows` chunks with their own vectors, and a qa_dataset.csv asking about each."""
    import chromadb

    collection = chromadb.PersistentClient(str(tmp / "store")).create_collection("bench")
    for start in range(0, rows, 2000):
        ids = range(start, min(start + 2000, rows))
        collection.add(
            ids=[f"c{i}" for i in ids],
            documents=[f"Widget {i} weighs {3 * i} grams, from depot {i % 17}." for i in ids],
            embeddings=[[float(i % 7), float(i % 11), 1.0] for i in ids],  # type: ignore[arg-type]
        )
    (tmp / "run").mkdir()
    with (tmp / "run" / "qa_dataset.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status"]
        )
        for i in range(rows):
            writer.writerow(
                [f"q{i}", f"c{i}", f"doc{i % 20}", f"How heavy is widget {i}?", "g", "ok"]
            )
    return tmp / "store"


def timed_reads(spent: list[float]) -> Any:
    """answer's get_chunks, adding each call's seconds to `spent`."""
    original = rag_base.get_chunks

    def reading(collection: Any, ids: list[str]) -> dict[str, str]:
        started = time.perf_counter()
        try:
            return original(collection, ids)
        finally:
            spent.append(time.perf_counter() - started)

    return reading


def main() -> None:
    """Run the stage in this process with timed store reads, then compare read sizes."""
    args = parse_args()
    from ragexam.store.chroma import StoreRef, get_chunks, open_collection

    with tempfile.TemporaryDirectory() as name, FakeOpenAI(latency=args.latency) as server:
        tmp = Path(name)
        os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="bench")
        store = build(tmp, args.rows)
        spent: list[float] = []
        rag_base.get_chunks = timed_reads(spent)  # the one read the answerers make
        started = time.perf_counter()
        result = ragexam.answer(
            store, out=tmp / "run", context="gold", concurrency=args.concurrency
        )
        wall = time.perf_counter() - started
        rag_base.get_chunks = get_chunks
        collection = open_collection(StoreRef(path=store))
        ids = [f"c{i}" for i in range(min(args.rows, 2000))]
        single = _per_question(lambda batch: get_chunks(collection, batch), ids, 1)
        batched = _per_question(lambda batch: get_chunks(collection, batch), ids, BATCH)
    print_rates("answer --context gold", args, result.figures["rows_ok"] / wall, None)
    print(f"  store reads: {len(spent)} calls, {sum(spent):.2f} s of {wall:.2f} s wall")
    print(f"  store reads / wall = {sum(spent) / wall:.3f}   (target <= 0.10)")
    print(
        f"  read per question: batched {1000 * batched:.3f} ms, one by one {1000 * single:.3f} ms,"
        f" ratio {single / batched:.1f}x"
    )


def _per_question(read: Any, ids: list[str], size: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(ids), size):
        read(ids[start : start + size])
    return (time.perf_counter() - started) / len(ids)


if __name__ == "__main__":
    main()
