"""Benchmark `ragexam judge` against the fake server with a set latency per call.

    uv run python bench/bench_judge.py [--rows 1000] [--concurrency 32] [--latency 0.2]

It prints rows/s against the ceiling (concurrency / latency) and against a bare
`openai.AsyncOpenAI` loop sending the same request at the same concurrency in the same run,
and the calls and tokens per row (exactly 1 call per row at --samples 1 with no faults), all
with the judge's controls off. Then it reruns with `--controls 10` on the judged exam and
counts the calls the controls add (target: exactly 80: four known answers and four
injections for each of ten questions).

Then it grades the same exam by key points (`--scale key-points`) and sets it beside the unit
scale: tokens per row (target: key points / unit <= 1.6), calls per row (1.00) and rows/s
(target: key points / unit >= 0.95; each scale's best of two runs, alternated). Both judges
reply as a model following its prompt would: the unit one writes in `reasoning` the ground
truth's facts found or missing and the answer's statements (as judge.toml asks), the
key-points one a verdict, with evidence, per key point and per statement. Tokens are counted
as GPT tokenizers roughly count English and JSON: each word, number or punctuation mark. The
test server does not bill the schema sent as response_format; a second ratio adds each
schema's JSON text to every call's prompt, an upper bound of what an endpoint bills for it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from common import FakeOpenAI, parse_args, print_rates, run_bare, run_stage
from judges import delimited, key_points, overlap, statements, truthful
from openai_server import Reply

from ragexam.stages.grading import UnitGrade
from ragexam.stages.marking import Marks


def write_exam(run: Path, rows: int) -> None:
    """qa_dataset.csv (with key points) and answers.csv for `rows` questions."""
    run.mkdir(parents=True)
    with (
        (run / "qa_dataset.csv").open("w", newline="") as qa,
        (run / "answers.csv").open("w", newline="") as answers,
    ):
        questions, replies = csv.writer(qa), csv.writer(answers)
        questions.writerow(
            ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", "key_points",
             "status", "error"]
        )  # fmt: skip
        replies.writerow(["qa_id", "answer", "retrieved_ids", "target_rank", "status", "error"])
        for i in range(rows):
            box = i % 5 + 2
            points = [
                f"Widget {i} weighs {3 * i} grams.",
                f"Widget {i} is made of steel.",
                f"Widget {i} ships in a box of {box}.",
            ]
            truth = (
                f"Widget {i} weighs {3 * i} grams, is made of steel and ships in a box of {box}."
            )
            questions.writerow(
                [f"q{i}", f"c{i}", f"doc{i % 20}", f"What is widget {i} like?", truth,
                 json.dumps(points), "ok", ""]
            )  # fmt: skip
            replies.writerow(
                [f"q{i}", f"It weighs {3 * i} grams, and it is blue.", "[]", "1", "ok", ""]
            )


def unit_judge(body: dict[str, Any]) -> Reply | None:
    """Two numbers, with the listing judge.toml asks for in `reasoning`."""
    truth, answer = delimited(body, "ground_truth"), delimited(body, "answer")
    if truth is None or answer is None:
        return None
    facts = [part.strip() for part in re.split(r",| and ", truth.rstrip(".")) if part.strip()]
    found = "; ".join(
        f"{fact} ({'present' if overlap(fact, answer)[0] == 1 else 'missing'})" for fact in facts
    )
    said = "; ".join(
        f"{s} ({'in' if overlap(truth, s)[1] >= 0.5 else 'not in'} the ground truth)"
        for s in statements(answer)
    )
    completeness, conciseness = overlap(truth, answer)
    reasoning = f"Ground truth facts: {found}. Answer statements: {said}."
    grades = {"completeness": round(completeness, 2), "conciseness": round(conciseness, 2)}
    return Reply(content=json.dumps({"reasoning": reasoning, **grades}))


def judge_model(body: dict[str, Any]) -> Reply | None:
    """The key-points judge for a marking request, the unit one otherwise."""
    return truthful(body) if key_points(body) is not None else unit_judge(body)


def tokens(text: str) -> int:
    """Each word, number or punctuation mark: roughly what GPT tokenizers count."""
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


def per_row(record: dict[str, Any], rows: int) -> tuple[float, float]:
    """Tokens per row in and out, from the stage's manifest record."""
    billed = record["tokens_billed"]
    return billed["prompt"] / rows, billed["completion"] / rows


def main() -> None:
    """Judge once with ragexam and once with the bare SDK; then by key points; print figures."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=args.latency) as server:
        server.responder, server.count_tokens = judge_model, tokens
        write_exam(Path(tmp) / "run", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        judge = ["judge", "--concurrency", str(args.concurrency)]
        unit = [*judge, "--scale", "unit"]
        record = run_stage(env, Path(tmp) / "run", [*unit, "--controls", "0"])
        calls = server.count()
        bare = run_bare(env, dict(server.requests[0].body), args.rows, args.concurrency)
        before = server.count()
        run_stage(env, Path(tmp) / "run", [*unit, "--controls", "10"])
        control_calls = server.count() - before
        before = server.count()
        marked = [*judge, "--scale", "key-points", "--controls", "0", "--force"]
        keyed = run_stage(env, Path(tmp) / "run", marked)
        keyed_calls = server.count() - before
        # a second round, the other way round: each scale's best of two, so that neither
        # gains from going second on a busy machine
        again = run_stage(env, Path(tmp) / "run", [*unit, "--controls", "0", "--force"])
        keyed_again = run_stage(env, Path(tmp) / "run", marked)
    rate = float(record["rows_per_second"])
    print_rates("judge", args, rate, bare)
    print(f"  calls per row  = {calls / args.rows:.3f}   (target 1.000 at --samples 1)")
    print(f"  --controls 10 adds {control_calls} calls   (target 80)")
    compare_scales(args.rows, _best(record, again), _best(keyed, keyed_again), keyed_calls)


def _best(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Of two runs of one scale, the faster one's record."""
    return max(first, second, key=lambda record: float(record["rows_per_second"]))


def compare_scales(
    rows: int, unit: dict[str, Any], keyed: dict[str, Any], keyed_calls: int
) -> None:
    """Key points beside the unit scale on the same exam: tokens, calls and rows/s."""
    unit_in, unit_out = per_row(unit, rows)
    key_in, key_out = per_row(keyed, rows)
    ratio = (key_in + key_out) / (unit_in + unit_out)
    schemas = [tokens(json.dumps(model.model_json_schema())) for model in (UnitGrade, Marks)]
    bounded = (key_in + key_out + schemas[1]) / (unit_in + unit_out + schemas[0])
    speed = float(keyed["rows_per_second"]) / float(unit["rows_per_second"])
    print("judge by key points, beside the unit scale, on the same exam:")
    print(f"  unit       tokens per row = {unit_in:.1f} in + {unit_out:.1f} out")
    print(f"  key points tokens per row = {key_in:.1f} in + {key_out:.1f} out")
    print(f"  key points / unit tokens  = {ratio:.3f}   (target <= 1.6)")
    print(f"  with the schemas' text    = {bounded:.3f}   ({schemas[0]} and {schemas[1]} tokens)")
    print(f"  key points calls per row  = {keyed_calls / rows:.3f}   (target 1.000)")
    print(f"  unit       {float(unit['rows_per_second']):7.1f} rows/s (best of two)")
    print(f"  key points {float(keyed['rows_per_second']):7.1f} rows/s (best of two)")
    print(f"  key points / unit rows/s  = {speed:.3f}   (target >= 0.95)")


if __name__ == "__main__":
    main()
