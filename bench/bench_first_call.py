"""Benchmark the time from starting `ragexam judge` on a large exam to its first calls.

    uv run python bench/bench_first_call.py [--rows 100000] [--repeat 5]

In the same run it times a bare `openai.AsyncOpenAI` loop from its start to its first call,
and prints the best of each and their ratios (target: at most 1.5). Two clocks stop for
ragexam: at its first request of any kind (`GET /v1/models`, the check that the model exists,
sent once before any chat call) and at its first chat call, which follows that check's reply.
The bare loop's first request is its chat call. Each process is stopped once both are seen.

The floor: a process that only imports what `judge` cannot call without (openai, and
langchain-openai with the langchain-core and langsmith it loads), timed from its start to the
end of the imports; once as any program does, once with the cycle collector held, as ragexam
loads them.

One untimed run of each comes first, with bytecode caching on, so that all start from
compiled modules as they do on a user's machine. The server answers at once (no latency):
the check's reply then costs only its round trip, as from a real endpoint's model list.
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

FLOOR = "import openai, langchain_openai"
FLOORS = {
    "floor, imports": f"{FLOOR}; print(flush=True)",
    "floor, imports, collector held": f"import gc; gc.disable(); {FLOOR}; print(flush=True)",
}


def first_calls(command: list[str], env: dict[str, str], server: FakeOpenAI) -> tuple[float, float]:
    """Seconds from starting `command` to the server receiving its first request of any kind,
    and to its first chat call (polled each millisecond)."""
    requests, listings = len(server.requests), len(server.listings)
    started = time.monotonic()
    first = None
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while len(server.requests) == requests:
            now = time.monotonic()
            if first is None and len(server.listings) > listings:
                first = now - started
            if now - started > 300 or process.poll() is not None:
                raise RuntimeError(f"no call from {command[:4]}")
            time.sleep(0.001)
        chat = time.monotonic() - started
        return (chat if first is None else first), chat
    finally:
        process.terminate()
        process.wait()


def import_time(code: str, env: dict[str, str]) -> float:
    """Seconds from starting `python -c CODE` to the line it prints when its imports are done."""
    started = time.monotonic()
    command = [sys.executable, "-c", code]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        process.stdout.readline()
        seconds = time.monotonic() - started
    return seconds


def main() -> None:
    """Write the exam; time ragexam, the bare loop and the floor; print the ratios."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="take the best of this many")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as server:
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
            first_calls(command, env, server)
        best = {name: (float("inf"), float("inf")) for name in commands}
        floors = dict.fromkeys(FLOORS, float("inf"))
        for _ in range(args.repeat):
            for name, command in commands.items():
                first, chat = first_calls(command, env, server)
                print(f"{name:<9} first request {first:5.2f} s, first chat call {chat:5.2f} s")
                best[name] = (min(best[name][0], first), min(best[name][1], chat))
                (run / "judgments.csv").unlink(missing_ok=True)
            for name, code in FLOORS.items():
                floors[name] = min(floors[name], import_time(code, env))
    report(args.rows, best["ragexam"], best["bare SDK"][1], floors, os.getloadavg())


def report(
    rows: int,
    ragexam: tuple[float, float],
    bare: float,
    floors: dict[str, float],
    load: tuple[float, ...],
) -> None:
    """The best times and their ratios to the bare loop's first call."""
    print(f"judge on {rows:,} rows, best of each, load average {load[0]:.1f}:")
    lines = [
        ("bare SDK loop, first call", bare),
        ("ragexam, first request (model list)", ragexam[0]),
        ("ragexam, first chat call", ragexam[1]),
        *((f"{name}: {FLOOR}", seconds) for name, seconds in floors.items()),
    ]
    for label, seconds in lines:
        print(f"  {label:<70} {seconds:5.2f} s = {seconds / bare:.2f} x bare (target <= 1.5)")


if __name__ == "__main__":
    main()
