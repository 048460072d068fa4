"""Benchmark `judge` and `generate` at hundreds of calls in flight, beside a bare SDK loop.

    uv run python bench/bench_scale.py [--stages judge,generate] [--concurrency 32,128,256,512]
                                       [--latency 1.0] [--waves 20]

For each stage and concurrency C it runs the stage on waves x C rows against the test server
with a set latency, then a bare `openai.AsyncOpenAI` loop (the SDK's defaults, as a user would
write it) sending the same request at the same concurrency, in the same run. It prints rows/s
against the ceiling (C / latency) and against the bare loop (targets: >= 0.9 up to 256,
>= 1.0 at 512), the CPU per call of each process, and the connections each opened. CPU per
call leaves out each process's start-up: ragexam's is measured by rerunning the finished stage
(nothing left to do), the bare loop's by starting the SDK without a call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_generate import build_store
from bench_judge import write_exam
from common import FakeOpenAI, child_cpu, run_bare, run_stage

BARE_START = "import openai; openai.AsyncOpenAI(max_retries=0, timeout=60)"


def stage_args(stage: str, folder: Path, rows: int) -> list[str]:
    """Write the stage's input for `rows` rows; the command line that runs it."""
    if stage == "judge":
        write_exam(folder / "run", rows)
        return ["judge", "--controls", "0"]
    build_store(folder / "store", rows)
    return ["generate", "--chroma", str(folder / "store")]


def cpu_of(command: list[str], env: dict[str, str]) -> float:
    """CPU seconds a command takes, in its own process."""
    started = child_cpu()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return child_cpu() - started


def measure(
    server: FakeOpenAI, stage: str, concurrency: int, options: argparse.Namespace
) -> dict[str, Any]:
    """One stage at one concurrency, and the bare loop beside it."""
    rows = options.waves * concurrency
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        args = [*stage_args(stage, Path(tmp), rows), "--concurrency", str(concurrency)]
        server.reset()
        server.latency, server.connections = options.latency, 0
        record = run_stage(env, Path(tmp) / "run", args)
        figures = {"rate": float(record["rows_per_second"]), "connections": server.connections}
        figures["calls"] = server.count()
        command = [sys.executable, "-m", "ragexam.cli", *args, "--out", str(Path(tmp) / "run")]
        figures["cpu"] = (record["cpu_seconds"] - cpu_of(command, env)) / figures["calls"]
        body, server.connections = dict(server.requests[0].body), 0
        started = child_cpu()
        figures["bare"] = run_bare(env, body, rows, concurrency)
        bare_cpu = child_cpu() - started - cpu_of([sys.executable, "-c", BARE_START], env)
        figures["bare_cpu"], figures["bare_connections"] = bare_cpu / rows, server.connections
    return figures


def report(stage: str, concurrency: int, latency: float, figures: dict[str, Any]) -> None:
    """One line of the table."""
    ceiling = concurrency / latency
    print(
        f"{stage:<9} {concurrency:>4} {figures['rate']:8.1f} {figures['bare']:8.1f} "
        f"{figures['rate'] / ceiling:7.2f} {figures['rate'] / figures['bare']:7.2f} "
        f"{1000 * figures['cpu']:6.2f} / {1000 * figures['bare_cpu']:4.2f} ms "
        f"{figures['connections']:6d} / {figures['bare_connections']:d}",
        flush=True,
    )


def main() -> None:
    """Every stage at every concurrency; one line each."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stages", default="judge,generate")
    parser.add_argument("--concurrency", default="32,128,256,512")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per call")
    parser.add_argument("--waves", type=int, default=20, help="rows = waves x concurrency")
    args = parser.parse_args()
    print(f"latency {args.latency} s, {args.waves} x concurrency rows")
    print("stage        C  ragexam     bare  ÷ceil  ÷bare  CPU/call ragexam / bare  conns r / b")
    with FakeOpenAI() as server:
        for stage in args.stages.split(","):
            for concurrency in map(int, args.concurrency.split(",")):
                figures = measure(server, stage, concurrency, args)
                report(stage, concurrency, args.latency, figures)


if __name__ == "__main__":
    main()
