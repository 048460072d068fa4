"""Benchmark `ragexam generate` against a server that enforces a rate limit, beside a bare SDK loop.

    uv run python bench/bench_rate_limit.py [--rows 2000] [--concurrency 128] [--latency 0.2]
                                            [--rpm 1200] [--window 6]

The test server admits at most rpm * window / 60 chat calls in any `window` seconds (a
sliding window; 120 per 6 s is 1,200 a minute) and answers the rest 429 with Retry-After.
It prints throughput / limit and the share of calls answered 429, for ragexam (adaptive
concurrency) and for a bare `openai.AsyncOpenAI` loop with a semaphore and the SDK's own
retries, which honour Retry-After but keep every worker sending.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_generate import build_store
from common import FakeOpenAI, run_stage
from openai_server import Faults

BARE_LOOP = """
import asyncio, json, sys, time, openai
rows, concurrency, body = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
async def main():
    client = openai.AsyncOpenAI(max_retries=10, timeout=60)  # the SDK retries 429s itself
    gate, failed = asyncio.Semaphore(concurrency), 0
    async def one(i):
        nonlocal failed
        async with gate:
            messages = [dict(m) for m in body["messages"]]
            messages[-1]["content"] += f" {i}"
            try:
                await client.chat.completions.create(**{**body, "messages": messages})
            except openai.APIError:
                failed += 1
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(rows)))
    print(json.dumps({"seconds": time.perf_counter() - started, "failed": failed}))
asyncio.run(main())
"""


def parse_args() -> argparse.Namespace:
    """The issue's figures as defaults."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per call")
    parser.add_argument("--rpm", type=int, default=1200, help="the server's limit per minute")
    parser.add_argument("--window", type=float, default=6.0, help="its sliding window, seconds")
    return parser.parse_args()


def limit(server: FakeOpenAI, args: argparse.Namespace) -> None:
    """A fresh window and request log on the server."""
    server.reset()
    server.latency = args.latency
    server.faults = Faults(rpm_limit=round(args.rpm * args.window / 60), rpm_window=args.window)


def share_429(server: FakeOpenAI) -> tuple[int, float]:
    """Calls received, and the share of them refused by the limit."""
    calls = len(server.requests)
    return calls, sum(request.fault == "rpm_limit" for request in server.requests) / calls


def main() -> None:
    """Run ragexam, then the bare loop, against the same limit; print the figures."""
    args = parse_args()
    rate = args.rpm / 60
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as server:
        build_store(Path(tmp) / "store", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        limit(server, args)
        store = ["--chroma", str(Path(tmp) / "store"), "--concurrency", str(args.concurrency)]
        record = run_stage(env, Path(tmp) / "run", ["generate", *store])
        ours = (float(record["rows_per_second"]), *share_429(server))
        body = dict(server.requests[-1].body)
        time.sleep(args.window)  # let the window empty
        limit(server, args)
        loop = [str(args.rows), str(args.concurrency), json.dumps(body)]
        out = subprocess.run(
            [sys.executable, "-c", BARE_LOOP, *loop], env=env, check=True, capture_output=True
        )
        bare = json.loads(out.stdout)
        theirs = ((args.rows - bare["failed"]) / bare["seconds"], *share_429(server))
    print(f"rate limit: {args.rpm} calls/min ({rate:.1f}/s) over a {args.window:g} s window; ")
    print(f"{args.rows} rows, concurrency {args.concurrency}, latency {args.latency}s")
    for name, (rows_per_s, calls, refused) in (("ragexam", ours), ("bare SDK", theirs)):
        print(
            f"  {name:9} {rows_per_s:6.1f} rows/s = {rows_per_s / rate:.3f} of the limit; "
            f"{calls} calls, {refused:.1%} answered 429"
        )
    print(f"  bare SDK rows that failed after the SDK's 10 retries: {bare['failed']}")
    print("  targets: ragexam >= 0.9 of the limit, <= 10% of calls answered 429")


if __name__ == "__main__":
    main()
