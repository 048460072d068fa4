"""Benchmark resuming a large judge output: the time and peak memory of reading it back.

    uv run python bench/bench_resume.py [--rows 200000] [--errors 10]

It writes a judgments.csv of `--rows` rows with every column ragexam writes (`--errors` of
them error rows, so that resume rewrites the file without them), then resumes it as the judge
stage would, in the same process: first timed, then again (after rewriting the file) under
tracemalloc for the peak of Python memory it allocated.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

from ragexam.io.rowlog import RowLog
from ragexam.stages.judge import JUDGE_COLUMNS
from ragexam.stages.runner import Runner, Stage

ROW = {
    "completeness": 1.0,
    "conciseness": 0.5,
    "samples": 1,
    "samples_valid": 1,
    "scale": "unit",
    "reasoning": "The answer gives the weight the ground truth holds, and adds the colour.",
    "status": "ok",
    "model": "gpt-4o-mini",
    "prompt_hash": "0123456789abcdef",
    "prompt_tokens": 120,
    "completion_tokens": 40,
    "attempts": 1,
    "latency_s": 1.02,
    "raw_reply": '{"completeness": 1, "conciseness": 0.5, "reasoning": "..."}',
}


def write_output(stage: Stage, rows: int, errors: int) -> None:
    """The stage's output: `rows` rows, the first `errors` of them error rows."""
    RowLog(stage.path, stage.all_columns()).rewrite(
        {
            **ROW,
            "qa_id": f"q{i}",
            "input_hash": f"{i:016x}",
            "status": "error" if i < errors else "ok",
        }
        for i in range(rows)
    )


def main() -> None:
    """Write the output, resume it timed, then again under tracemalloc; print both."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--errors", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "judgments.csv"
        stage = Stage("judge", path, "qa_id", JUDGE_COLUMNS, ROW["model"], ROW["prompt_hash"])
        write_output(stage, args.rows, args.errors)
        size = path.stat().st_size
        started = time.perf_counter()
        done = Runner(stage, concurrency=1).resume()
        seconds = time.perf_counter() - started
        write_output(stage, args.rows, args.errors)
        tracemalloc.start()
        Runner(stage, concurrency=1).resume()
        peak = tracemalloc.get_traced_memory()[1]
    print(f"resume {args.rows:,} rows ({size / 1e6:.0f} MB, {args.errors} error rows dropped):")
    print(f"  {seconds:.2f} s; peak memory {peak / 1e6:.0f} MB ({peak / size:.1f}x the file)")
    assert len(done) == args.rows - args.errors


if __name__ == "__main__":
    main()
