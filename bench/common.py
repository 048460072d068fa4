"""What the benchmarks share: the test server, a bare SDK loop, and the child processes' CPU."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import extractive  # noqa: E402
from openai_server import FakeOpenAI  # noqa: E402
from world import World  # noqa: E402

__all__ = [
    "ROOT",
    "FakeOpenAI",
    "World",
    "arguments",
    "child_cpu",
    "extractive",
    "parse_args",
    "print_rates",
    "run_bare",
    "run_stage",
]

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


def parse_args() -> argparse.Namespace:
    """--rows, --concurrency and --latency, with the issues' defaults."""
    return arguments().parse_args()


def arguments() -> argparse.ArgumentParser:
    """The parser of parse_args, for a benchmark that takes more."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per call")
    return parser


def print_rates(stage: str, args: argparse.Namespace, rate: float, bare: float | None) -> None:
    """rows/s, the ceiling (concurrency / latency), and the ratios the issues set targets for."""
    ceiling = args.concurrency / args.latency
    print(f"{stage}: {args.rows} rows, concurrency {args.concurrency}, latency {args.latency}s")
    print(f"  ragexam   {rate:7.1f} rows/s")
    if bare is not None:
        print(f"  bare SDK  {bare:7.1f} rows/s")
    print(f"  ceiling   {ceiling:7.1f} rows/s (concurrency / latency)")
    print(f"  ragexam / ceiling  = {rate / ceiling:.3f}   (target >= 0.85)")
    if bare is not None:
        print(f"  ragexam / bare SDK = {rate / bare:.3f}   (target >= 0.90)")


def child_cpu() -> float:
    """CPU seconds used so far by finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_stage(env: dict[str, str], out: Path, args: list[str]) -> dict[str, Any]:
    """Run `ragexam ARGS` in its own process; the stage's manifest record, with its CPU time."""
    started = child_cpu()
    subprocess.run(
        [sys.executable, "-m", "ragexam.cli", *args, "--out", str(out)],
        env=env,
        check=True,
        stderr=subprocess.DEVNULL,
    )
    record: dict[str, Any] = json.loads((out / "manifest.json").read_text())["stages"][args[0]]
    return {**record, "cpu_seconds": child_cpu() - started}


def run_bare(env: dict[str, str], body: dict[str, Any], rows: int, concurrency: int) -> float:
    """rows/s of a bare openai.AsyncOpenAI loop sending `body`, in its own process."""
    out = subprocess.run(
        [sys.executable, "-c", BARE_LOOP, str(rows), str(concurrency), json.dumps(body)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())
