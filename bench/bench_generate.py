"""Benchmark `ragexam generate` against the fake server with a set latency per call.

    uv run python bench/bench_generate.py [--rows 1000] [--concurrency 32] [--latency 0.2]

It prints rows/s, the ceiling (concurrency / latency) and their ratio, and the ratio to a
bare `openai.AsyncOpenAI` loop sending the same requests at the same concurrency, measured
in the same run. Both clients run in their own process; the server runs in this one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from common import FakeOpenAI, parse_args, print_rates, run_bare, run_stage


def build_store(path: Path, rows: int) -> None:
    """A store of `rows` chunks with explicit embeddings (no model download)."""
    import chromadb

    collection = chromadb.PersistentClient(str(path)).create_collection("bench")
    for start in range(0, rows, 1000):
        ids = [f"chunk-{i:06d}" for i in range(start, min(start + 1000, rows))]
        collection.add(
            ids=ids,
            embeddings=[[float(i % 7), 1.0, 0.5] for i in range(len(ids))],
            documents=[f"Fact {i}: widget {i} weighs {i * 3} grams." for i in ids],
            metadatas=[{"source": f"doc{hash(i) % 20}.md"} for i in ids],
        )


def main() -> None:
    """Run both clients once and print the figures."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=args.latency) as server:
        build_store(Path(tmp) / "store", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        record = run_stage(
            env,
            Path(tmp) / "run",
            [
                "generate",
                "--chroma",
                str(Path(tmp) / "store"),
                "--concurrency",
                str(args.concurrency),
            ],
        )
        bare = run_bare(env, dict(server.requests[0].body), args.rows, args.concurrency)
    rate = float(record["rows_per_second"])
    print_rates("generate", args, rate, bare)
    print(
        f"  ragexam process CPU per row, start-up included: "
        f"{1000 * record['cpu_seconds'] / args.rows:.1f} ms"
    )


if __name__ == "__main__":
    main()
