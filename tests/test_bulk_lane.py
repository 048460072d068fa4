"""The batch road's bulk lane (stages/bulk.py): a judge merge writes, byte for byte, the file
the direct lane writes from the same results.

Each test runs the same exam and results twice, in two folders: once as a user runs it, once
with the lane taken away; the second run is what ragexam wrote before it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAI, Reply
from support import number, read_csv, run_batch_files, run_cli, write_dict_rows

from ragexam.llm.endpoint import SystemCheck
from ragexam.stages import judge
from ragexam.stages.bulk import Lane

WAITING = 75
# Cells a CSV writer must quote or a spreadsheet must not run, and texts no lane may change.
AWKWARD = ["=SUM(A1)", "-1 point", "+x", "@me", 'a "quoted" word', "one, two", "line\nbreak",
           "lone\rreturn", "\tlead", "", "é € 😀", "'=already", "x" * 300]  # fmt: skip


def write_exam(run: Path, n: int) -> None:
    """An exam whose ids and answers start like formulas, hold commas, quotes and returns."""
    ids = [f"{AWKWARD[i % 5][:2]}q{i}" if i % 3 == 0 else f"q{i}" for i in range(n)]
    write_dict_rows(
        run / "qa_dataset.csv",
        [
            {"qa_id": qa_id, "chunk_id": f"c{i}", "document": f"doc{i % 4}",
             "question": f"Question #{i}? {AWKWARD[i % len(AWKWARD)]}",
             "ground_truth_answer": f"Truth #{i}.", "status": "ok", "error": ""}
            for i, qa_id in enumerate(ids)
        ],
    )  # fmt: skip
    write_dict_rows(
        run / "answers.csv",
        [
            {"qa_id": qa_id, "answer": f"Answer #{i}: {AWKWARD[(i + 3) % len(AWKWARD)]}",
             "retrieved_ids": "[]", "target_rank": "1", "status": "ok", "error": ""}
            for i, qa_id in enumerate(ids)
        ],
    )  # fmt: skip


def completeness(i: int, ten: bool) -> float:
    """Question #i's completeness, as the judge gives it on the unit or the ten scale."""
    return i % 11 if ten else (i % 11) / 10


def grades(body: dict[str, Any]) -> Reply:
    """Grades that vary by question: reasonings of every awkward kind; some wrapped in a
    fence (the direct lane's tolerant reader takes those), one in ten a server error."""
    i = number(body, "Question")
    if i % 10 == 7:
        return Reply(status=500, error_message="The server had an error.")
    ten = "whole number from 0 to 10" in body["messages"][0]["content"]
    grade = {"reasoning": AWKWARD[i % len(AWKWARD)], "completeness": completeness(i, ten)}
    text = json.dumps(
        {**grade, "conciseness": (10 if ten else 1) if i % 4 else (2 if ten else 0.25)}
    )
    return Reply(content=f"```json\n{text}\n```" if i % 6 == 5 else text)


def merged(env: FakeOpenAI, folder: Path, n: int, *options: str) -> bytes:
    """judge --batch-dir on a fresh exam in `folder`, its results written, then merged."""
    write_exam(folder / "run", n)
    command = ("judge", "--out", str(folder / "run"), "--controls", "0")
    command += ("--batch-dir", str(folder / "files"), *options)
    assert run_cli(*command).exit_code == WAITING
    run_batch_files(env, folder / "files")
    result = run_cli(*command)
    assert result.exit_code in (0, WAITING), result.output  # the failed lines ask again
    return (folder / "run" / "judgments.csv").read_bytes()


def counting(monkeypatch: pytest.MonkeyPatch, cls: Any, name: str) -> Counter[Any]:
    """Count what a method returns, call by call."""
    seen: Counter[Any] = Counter()
    real = getattr(cls, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        value = real(*args, **kwargs)
        seen[value is not None and value is not False] += 1
        return value

    monkeypatch.setattr(cls, name, spy)
    return seen


@pytest.mark.parametrize("scale", ["unit", "ten"])
def test_the_bulk_lane_writes_the_direct_lanes_file_byte_for_byte(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: str
) -> None:
    env.responder = grades
    n = 60
    with monkeypatch.context() as without:
        without.setattr(judge.JudgePlan, "bulk", lambda self: None)
        before = merged(env, tmp_path / "direct", n, "--scale", scale)
    read = counting(monkeypatch, Lane, "line_of")
    after = merged(env, tmp_path / "bulk", n, "--scale", scale)
    assert after == before
    plain = sum(1 for i in range(n) if i % 10 != 7 and i % 6 != 5)
    # each plain row but the first ones, read the whole way while ragexam checks from their
    # usage how the endpoint bills a system message, and the one the lane learned its line from
    assert read[True] == plain - SystemCheck.CALLS - 1
    rows = read_csv(tmp_path / "bulk" / "run" / "judgments.csv")
    by_number = {int(row["qa_id"].split("q")[-1]): row for row in rows}
    assert sorted(by_number) == [i for i in range(n) if i % 10 != 7]  # those ask again
    assert all(row["reasoning"] == AWKWARD[i % len(AWKWARD)] for i, row in by_number.items())
    divisor = 10 if scale == "ten" else 1
    assert all(
        float(row["completeness"]) == completeness(i, scale == "ten") / divisor
        for i, row in by_number.items()
    )
