"""Benchmark the time from starting `ragexam judge` on a large exam to its first call.

    uv run python bench/bench_first_call.py [--rows 100000] [--repeat 3]

In the same run it times a bare `openai.AsyncOpenAI` loop from its start to its first call,
and prints the best of each and their ratio (target: at most 1.5). The clock stops when the
test server receives the first request; each process is then stopped. One untimed run of
each comes first, with bytecode caching on, so that both start from compiled modules as they
do on a user's machine.
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

from bench_judge import write_exam
from common import BARE_LOOP, FakeOpenAI


def time_to_first_call(command: list[str], env: dict[str, str], server: FakeOpenAI) -> float:
    """Seconds from starting `command` to the server receiving its first request.

    Any request counts: ragexam asks `GET /v1/models` (server.listings) once before its first
    chat call, and the server's latency delays that reply too.
    """
    before = len(server.requests) + len(server.listings)
    started = time.monotonic()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while len(server.requests) + len(server.listings) == before:  # polled each millisecond
            if time.monotonic() - started > 300 or process.poll() is not None:
                raise RuntimeError(f"no call from {command[:4]}")
            time.sleep(0.001)
        return time.monotonic() - started
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    """Write the exam, time ragexam and the bare loop to their first call, print the ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="take the best of this many")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=5.0) as server:
        run = Path(tmp) / "run"
        write_exam(run, args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]}
        commands = {
            "ragexam": [sys.executable, "-m", "ragexam.cli", "judge", "--out", str(run)],
            "bare SDK": [sys.executable, "-c", BARE_LOOP, "1", "1", json.dumps(body)],
        }
        for command in commands.values():  # untimed: compiles and caches every module
            time_to_first_call(command, env, server)
        best = {name: float("inf") for name in commands}
        for _ in range(args.repeat):
            for name, command in commands.items():
                seconds = time_to_first_call(command, env, server)
                print(f"{name:<9} {seconds:6.2f} s to the first call", flush=True)
                best[name] = min(best[name], seconds)
                (run / "judgments.csv").unlink(missing_ok=True)
    ratio = best["ragexam"] / best["bare SDK"]
    print(f"judge on {args.rows:,} rows: first call after {best['ragexam']:.2f} s; bare SDK loop")
    print(f"  {best['bare SDK']:.2f} s; ragexam / bare = {ratio:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
