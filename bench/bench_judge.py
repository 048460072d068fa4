"""Benchmark `ragexam judge` against the fake server with a set latency per call.

    uv run python bench/bench_judge.py [--rows 1000] [--concurrency 32] [--latency 0.2]

It prints rows/s against the ceiling (concurrency / latency) and against a bare
`openai.AsyncOpenAI` loop sending the same request at the same concurrency in the same run,
and the calls and tokens per row (exactly 1 call per row at --samples 1 with no faults), all
with the judge's controls off. Then it reruns with `--controls 10` on the judged exam and
counts the calls the controls add (target: exactly 40).
"""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

from common import FakeOpenAI, parse_args, print_rates, run_bare, run_stage


def write_exam(run: Path, rows: int) -> None:
    """qa_dataset.csv and answers.csv for `rows` questions."""
    run.mkdir(parents=True)
    with (
        (run / "qa_dataset.csv").open("w", newline="") as qa,
        (run / "answers.csv").open("w", newline="") as answers,
    ):
        questions, replies = csv.writer(qa), csv.writer(answers)
        questions.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "status", "error"]
        )
        replies.writerow(["qa_id", "answer", "retrieved_ids", "target_rank", "status", "error"])
        for i in range(rows):
            questions.writerow(
                [
                    f"q{i}",
                    f"c{i}",
                    f"doc{i % 20}",
                    f"How heavy is widget {i}?",
                    f"Widget {i} weighs {3 * i} grams.",
                    "ok",
                    "",
                ]
            )
            replies.writerow(
                [f"q{i}", f"It weighs {3 * i} grams, and it is blue.", "[]", "1", "ok", ""]
            )


def main() -> None:
    """Judge once with ragexam and once with the bare SDK; print the figures."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=args.latency) as server:
        write_exam(Path(tmp) / "run", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        judge = ["judge", "--concurrency", str(args.concurrency)]
        record = run_stage(env, Path(tmp) / "run", [*judge, "--controls", "0"])
        calls = server.count()
        bare = run_bare(env, dict(server.requests[0].body), args.rows, args.concurrency)
        before = server.count()
        run_stage(env, Path(tmp) / "run", [*judge, "--controls", "10"])
        control_calls = server.count() - before
    rate = float(record["rows_per_second"])
    billed = record["tokens_billed"]
    print_rates("judge", args, rate, bare)
    print(f"  calls per row  = {calls / args.rows:.3f}   (target 1.000 at --samples 1)")
    print(f"  --controls 10 adds {control_calls} calls   (target 40)")
    print(
        f"  tokens per row = {billed['prompt'] / args.rows:.1f} in + "
        f"{billed['completion'] / args.rows:.1f} out"
    )


if __name__ == "__main__":
    main()
