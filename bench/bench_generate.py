"""Benchmark `ragexam generate` against the fake server with a set latency per call.

    uv run python bench/bench_generate.py [--rows 1000] [--concurrency 32] [--latency 0.2]

It prints rows/s, the ceiling (concurrency / latency) and their ratio, and the ratio to a
bare `openai.AsyncOpenAI` loop sending the same requests at the same concurrency, measured
in the same run. Both clients run in their own process; the server runs in this one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import FakeOpenAI  # noqa: E402

BARE_LOOP = """
import asyncio, json, sys, time, openai
rows, concurrency, body = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
async def main():
    client = openai.AsyncOpenAI(max_retries=0, timeout=60)
    gate = asyncio.Semaphore(concurrency)
    async def one(i):
        async with gate:
            messages = [dict(m) for m in body["messages"]]
            messages[-1]["content"] += f" {i}"
            await client.chat.completions.create(**{**body, "messages": messages})
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(rows)))
    print(rows / (time.perf_counter() - started))
asyncio.run(main())
"""


def build_store(path: Path, rows: int) -> None:
    """A store of `rows` chunks with explicit embeddings (no model download)."""
    import chromadb

    client = chromadb.PersistentClient(str(path))
    collection = client.create_collection("bench")
    for start in range(0, rows, 1000):
        ids = [f"chunk-{i:06d}" for i in range(start, min(start + 1000, rows))]
        collection.add(
            ids=ids,
            embeddings=[[float(i % 7), 1.0, 0.5] for i in range(len(ids))],
            documents=[f"Fact {i}: widget {i} weighs {i * 3} grams." for i in ids],
            metadatas=[{"source": f"doc{hash(i) % 20}.md"} for i in ids],
        )


def child_cpu() -> float:
    """CPU seconds used so far by finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ragexam(env: dict[str, str], store: Path, out: Path, concurrency: int) -> float:
    """rows/s of the generate stage, as the runner measured its own loop."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ragexam.cli",
            "generate",
            "--chroma",
            str(store),
            "--out",
            str(out),
            "--concurrency",
            str(concurrency),
        ],
        env=env,
        check=True,
        stderr=subprocess.DEVNULL,
    )
    record = json.loads((out / "manifest.json").read_text())["stages"]["generate"]
    return float(record["rows_per_second"])


def run_bare(env: dict[str, str], server: FakeOpenAI, rows: int, concurrency: int) -> float:
    """rows/s of a bare SDK loop sending the same request generate sends."""
    body = dict(server.requests[0].body)
    out = subprocess.run(
        [sys.executable, "-c", BARE_LOOP, str(rows), str(concurrency), json.dumps(body)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


def main() -> None:
    """Run both clients once and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=args.latency) as server:
        build_store(Path(tmp) / "store", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        cpu = child_cpu()
        ragexam = run_ragexam(env, Path(tmp) / "store", Path(tmp) / "run", args.concurrency)
        cpu_ragexam, cpu = child_cpu() - cpu, child_cpu()
        bare = run_bare(env, server, args.rows, args.concurrency)
        cpu_bare = child_cpu() - cpu
    ceiling = args.concurrency / args.latency
    print(f"generate: {args.rows} rows, concurrency {args.concurrency}, latency {args.latency}s")
    print(f"  ragexam   {ragexam:7.1f} rows/s")
    print(f"  bare SDK  {bare:7.1f} rows/s")
    print(f"  ceiling   {ceiling:7.1f} rows/s (concurrency / latency)")
    print(f"  ragexam / ceiling  = {ragexam / ceiling:.3f}   (target >= 0.85)")
    print(f"  ragexam / bare SDK = {ragexam / bare:.3f}   (target >= 0.90)")
    print(
        f"  client CPU per row, whole process incl. start-up: ragexam "
        f"{1000 * cpu_ragexam / args.rows:.1f} ms, bare SDK {1000 * cpu_bare / args.rows:.1f} ms"
    )


if __name__ == "__main__":
    main()
