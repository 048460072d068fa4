"""The batch road's bulk lane (stages/bulk.py) and its forked child (stages/forked.py): a judge
merge writes, byte for byte, the file the direct lane writes from the same results, whichever
process read them, and a child that fails, or a run stopped while one works, loses nothing.

Each test runs the same exam and results twice, in two folders: once as a user runs it, once
with the lane (or the child) taken away; the second run is what ragexam wrote before either.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAI, Reply
from support import number, read_csv, run_batch_files, run_cli, write_dict_rows

import ragexam
from ragexam.errors import BatchPending
from ragexam.io import batchfiles
from ragexam.llm.client import LLM
from ragexam.llm.endpoint import SystemCheck
from ragexam.stages import forked, judge, replay, room
from ragexam.stages.bulk import Lane
from ragexam.stages.packed import Packed

WAITING = 75
LINUX = pytest.mark.skipif(sys.platform != "linux", reason="children are forked on Linux only")
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
    command = answered(env, folder, n, *options)
    result = run_cli(*command)
    assert result.exit_code in (0, WAITING), result.output  # the failed lines ask again
    return (folder / "run" / "judgments.csv").read_bytes()


def answered(env: FakeOpenAI, folder: Path, n: int, *options: str) -> tuple[str, ...]:
    """A fresh exam in `folder` whose judge requests were written and answered: the command
    that merges them."""
    write_exam(folder / "run", n)
    command = ("judge", "--out", str(folder / "run"), "--controls", "0")
    command += ("--batch-dir", str(folder / "files"), *options)
    with pytest.MonkeyPatch.context() as alone:  # the requests, in one process: the merge is
        alone.setattr(forked, "ROWS_TO_FORK", 1 << 62)  # what the tests below fork for
        assert run_cli(*command).exit_code == WAITING
    run_batch_files(env, folder / "files")
    return command


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


def many(monkeypatch: pytest.MonkeyPatch, cores: int = 2) -> None:
    """Children for a pass of a few dozen rows, on any machine: one a spare core."""
    monkeypatch.setattr(forked, "ROWS_TO_FORK", 8)
    monkeypatch.setattr(forked, "cores", lambda: cores)


def alone_then_many(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, cores: int = 2
) -> tuple[bytes, Counter[Any]]:
    """The merge of n rows in one process; then children for the next, counted as they end
    (True: a child that read its rows)."""
    alone = merged(env, tmp_path / "alone", n)
    many(monkeypatch, cores)
    return alone, counting(monkeypatch, forked.Child, "lines")


@LINUX
@pytest.mark.parametrize(("cores", "packs"), [(2, True), (4, True), (2, False)])
def test_forked_children_read_the_last_rows_and_the_file_is_the_same(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, packs: bool
) -> None:
    """Each process reads its rows packed (packed.py), or, rows that do not pack, as they are."""
    env.responder = grades
    n = 80
    alone, children = alone_then_many(env, tmp_path, monkeypatch, n, cores)
    if not packs:
        monkeypatch.setattr(Packed, "of", classmethod(lambda cls, tasks: None))
    read = counting(monkeypatch, Packed, "rows")  # in this process: its own rows
    adopted: list[int] = []  # rows written at once from the children's lines
    write_many = Lane.write_many

    def adopting(lane: Lane, rows: Any) -> None:
        adopted.append(len(rows))
        write_many(lane, rows)

    monkeypatch.setattr(Lane, "write_many", adopting)
    assert merged(env, tmp_path / "forked", n) == alone
    assert children == Counter({True: cores - 1})  # a child a spare core, each read its rows
    assert read == (Counter({True: 1}) if packs else Counter())
    left = n - SystemCheck.CALLS - 1  # after the row the lane learned from
    mine = forked.shares(left, cores - 1)[0]
    theirs = range(n - left + mine, n)
    assert sum(adopted) == sum(1 for i in theirs if i % 10 != 7 and i % 6 != 5)  # plain ones
    assert figures(tmp_path / "forked") == figures(tmp_path / "alone")  # counted, billed alike


def requests(env: FakeOpenAI, folder: Path, n: int) -> dict[str, Any]:
    """judge --batch-dir writing the requests of a fresh exam: its request lines, and the
    shards' names, in order. Each shard is whole, its ids file names its lines in order, its
    record counts them, and nothing else is left under the files folder."""
    write_exam(folder / "run", n)
    command = ("judge", "--out", str(folder / "run"), "--controls", "0")
    first = run_cli(*command, "--batch-dir", str(folder / "files"))
    assert first.exit_code == WAITING, first.output
    files = folder / "files"
    ledger = (folder / "run" / "batches" / "judge.jsonl").read_text(encoding="utf-8")
    shards = [event for event in map(json.loads, ledger.splitlines()) if event["event"] == "shard"]
    lines: list[bytes] = []
    recorded = {
        name: [folder / "run" / shard[name] for shard in shards] for name in ("path", "ids")
    }
    for shard, path, ids_path in zip(shards, recorded["path"], recorded["ids"], strict=True):
        written = path.read_bytes()
        assert len(written) == shard["bytes"] and written.count(b"\n") == shard["lines"]
        ids = [json.loads(line)["custom_id"] for line in written.splitlines()]
        assert ids_path.read_text(encoding="utf-8").splitlines() == ids
        lines += written.splitlines()
    for name, folder_of in (("path", files), ("ids", recorded["ids"][0].parent)):
        on_disk = {path.resolve() for path in folder_of.rglob("*") if path.is_file()}
        assert on_disk == {path.resolve() for path in recorded[name]}  # the children's are gone
    return {"lines": sorted(lines), "names": [shard["name"] for shard in shards]}


@LINUX
@pytest.mark.parametrize("cores", [2, 3])
def test_forked_children_write_the_requests_one_process_writes(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    """Shards of 7 lines: each process's rows span several; the children's are named on
    from the parent's."""
    monkeypatch.setattr(batchfiles, "MAX_LINES", 7)
    n = 80
    alone = requests(env, tmp_path / "alone", n)
    many(monkeypatch, cores)
    children = counting(monkeypatch, forked.Child, "lines")
    sent = counting(monkeypatch, replay.Pass, "_send")
    forked_ = requests(env, tmp_path / "forked", n)
    assert forked_["lines"] == alone["lines"] and len(alone["lines"]) == n
    assert forked_["names"] == [f"judge-{k:06d}" for k in range(1, len(forked_["names"]) + 1)]
    assert children == Counter({True: cores - 1})  # a child a spare core, each made its rows
    # the parent made the first row's, the form learned from it, and its share of the rest
    assert sent[True] == 1 + forked.shares(n - 1, cores - 1)[0]
    run_batch_files(env, tmp_path / "forked" / "files")  # and they are merged as any
    command = ("judge", "--out", str(tmp_path / "forked" / "run"), "--controls", "0")
    assert run_cli(*command, "--batch-dir", str(tmp_path / "forked" / "files")).exit_code == 0
    assert len(read_csv(tmp_path / "forked" / "run" / "judgments.csv")) == n


def test_requests_to_two_urls_go_into_shards_each_of_its_own_name(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's name is the next the ledger has not recorded: two shards open at once took
    the same name, and the second could not take it (exit 2, on every rerun). A pass whose
    rows ask two URLs (every other row, here) finishes one URL's shard before it writes the
    other's."""
    real, turn = LLM.request_of, itertools.count()

    def two_urls(self: LLM, call: Any, body: bool = True) -> Any:
        rendered = real(self, call, body)
        if rendered is not None and next(turn) % 2:
            return rendered._replace(url="/v1/other/completions")
        return rendered

    monkeypatch.setattr(LLM, "request_of", two_urls)
    n = 12
    written = requests(env, tmp_path, n)  # each shard whole, and only the shards recorded
    assert len(written["lines"]) == n and len(set(written["names"])) == len(written["names"])
    urls = Counter(json.loads(line)["url"] for line in written["lines"])
    assert set(urls) == {"/v1/chat/completions", "/v1/other/completions"}


@LINUX
def test_the_shards_a_killed_runs_child_left_unrecorded_are_dropped(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill -9 after a child wrote shards, before the parent took them: they were never
    sent, and their rows are not out. The rerun writes those rows again and drops them."""
    n = 80
    alone = requests(env, tmp_path / "alone", n)
    leftovers = [
        tmp_path / "forked" / "files" / "requests" / ".forked-0" / "000001.jsonl",
        tmp_path / "forked" / "run" / "batches" / "judge" / "ids" / ".forked-0" / "000001.ids",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True)
        path.write_text('{"custom_id": "judge~0~00~q1"}\n')
    assert requests(env, tmp_path / "forked", n)["lines"] == alone["lines"]
    assert not any(path.parent.exists() for path in leftovers)


def declining(sender: Any) -> Any:
    """A child's way with requests, but every third row is left to the parent."""

    def declines(self: replay.Pass, *args: Any) -> Any:
        make, finish = sender(self, *args)
        return (lambda task: None if number_of(task.key) % 3 == 0 else make(task)), finish

    return declines


def number_of(key: str) -> int:
    return int(key.split("q")[-1])


@LINUX
@pytest.mark.parametrize("fault", ["declines", "fails"])
def test_rows_a_child_does_not_make_are_the_parents_and_the_requests_the_same(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """A row the child leaves (its first call is not rendered from the form), or every row
    of a child that failed (its shards, if any, dropped): the parent writes them."""
    monkeypatch.setattr(batchfiles, "MAX_LINES", 7)
    n = 80
    alone = requests(env, tmp_path / "alone", n)
    many(monkeypatch)
    children = counting(monkeypatch, forked.Child, "lines")
    sent = counting(monkeypatch, replay.Pass, "_send")
    if fault == "declines":
        monkeypatch.setattr(replay.Pass, "_sender", declining(replay.Pass._sender))
    else:
        monkeypatch.setattr(forked, "_child", exits)
    assert requests(env, tmp_path / "forked", n)["lines"] == alone["lines"]
    assert children == Counter({fault == "declines": 1})
    theirs = range(1 + forked.shares(n - 1, 1)[0], n)
    by_parent = n - len(theirs) + sum(1 for i in theirs if i % 3 == 0)
    assert sent[True] == (by_parent if fault == "declines" else n)


def figures(folder: Path) -> dict[str, Any]:
    """What the judge's record counts and bills, leaving out its times and paths."""
    stage = json.loads((folder / "run" / "manifest.json").read_text())["stages"]["judge"]
    counted = ("calls", "tokens_billed", "rows_ok", "rows_error", "prompt_tokens",
               "completion_tokens", "cost_usd", "structured_output")  # fmt: skip
    batch = {name: stage["batch"][name] for name in ("results_merged", "results_read")}
    return {**{name: stage[name] for name in counted}, **batch}


@LINUX
@pytest.mark.parametrize(("available", "children"), [(599, 0), (1_200, 2)])
def test_children_are_forked_only_as_the_free_memory_takes_them(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, available: int, children: int
) -> None:
    """Each child is given the parent's resident size, the most it can copy: 599 kB free
    beside a 600 kB parent takes none, 1,200 kB two of the three spare cores' children."""
    env.responder = grades
    n = 80
    alone, made = alone_then_many(env, tmp_path, monkeypatch, n, cores=4)
    monkeypatch.setattr(room, "memory", lambda: (available, 600))
    assert merged(env, tmp_path / "forked", n) == alone
    assert made == (Counter({True: children}) if children else Counter())


@LINUX
def test_no_child_is_forked_when_the_packed_rows_leave_no_room_for_it(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for a child before the rows are packed, none after (the parent has grown by its
    packs): the parent reads every row, as they are."""
    env.responder = grades
    n = 80
    alone, made = alone_then_many(env, tmp_path, monkeypatch, n)
    asked = iter([(1_000, 600)])  # then 500 kB free: the packs took the rest
    monkeypatch.setattr(room, "memory", lambda: next(asked, (500, 600)))
    read = counting(monkeypatch, Packed, "rows")
    assert merged(env, tmp_path / "forked", n) == alone
    assert made == Counter() and read == Counter({True: 1})  # its own rows, packed


class OldBar:
    """A user's progress, written to the protocol before `advance` took a count of rows."""

    def __init__(self) -> None:
        self.rows = 0

    def start(self, total: int | None, done_before: int) -> None:
        """Nothing to draw."""

    def advance(self, ok: bool) -> None:
        self.rows += 1

    def watch(self, traffic: Any) -> None:
        """Nothing to draw."""

    def batches(self, views: Any, note: str) -> None:
        """Nothing to draw."""


@LINUX
def test_a_progress_that_takes_no_count_is_told_a_childs_rows_one_at_a_time(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.responder = grades
    answered(env, tmp_path, 80)
    many(monkeypatch)
    children = counting(monkeypatch, forked.Child, "lines")
    bar = OldBar()

    class Watching(ragexam.Observer):
        def progress(self, stage: str) -> Any:
            return contextlib.nullcontext(bar)

    with contextlib.suppress(BatchPending), ragexam.Session(observer=Watching()) as session:
        ragexam.judge(
            out=tmp_path / "run", controls=0, batch_dir=tmp_path / "files", session=session
        )
    assert children == Counter({True: 1})
    assert bar.rows == len(read_csv(tmp_path / "run" / "judgments.csv")) > 40


def exits(*args: Any) -> None:
    os._exit(3)


def interrupted(*args: Any) -> None:
    """As Ctrl-C or SIGTERM would, through the parent's handlers, had they not waited."""
    raise KeyboardInterrupt


@LINUX
@pytest.mark.parametrize("child", [exits, interrupted])
def test_a_child_that_fails_leaves_its_rows_to_the_parent_and_runs_none_of_its_way_out(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, child: Any
) -> None:
    env.responder = grades
    n = 80
    alone, children = alone_then_many(env, tmp_path, monkeypatch, n)
    monkeypatch.setattr(forked, "_child", child)
    assert merged(env, tmp_path / "failed", n) == alone  # no row lost, none written twice
    assert children == Counter({False: 1})  # it was made, and failed


@LINUX
def test_ctrl_c_while_a_child_works_ends_it_and_a_rerun_writes_each_row_once(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.responder = grades
    n = 80
    merged(env, tmp_path / "alone", n)
    alone = {row["qa_id"]: row for row in read_csv(tmp_path / "alone" / "run" / "judgments.csv")}
    many(monkeypatch)
    pids: list[int] = []
    start, write = forked.Child.start, Lane.write

    def started(*args: Any) -> None:
        start(*args)
        pids.append(args[4][-1].pid)  # the child it put into the list of those to stop

    def stopped(self: Lane, *args: Any) -> None:
        if pids and self.written == 5:  # the parent's fifth row after the fork
            raise KeyboardInterrupt
        write(self, *args)

    monkeypatch.setattr(forked.Child, "start", started)
    monkeypatch.setattr(Lane, "write", stopped)
    folder = tmp_path / "stopped"
    command = answered(env, folder, n)
    assert run_cli(*command).exit_code == 130
    assert len(pids) == 1
    with pytest.raises(ChildProcessError):  # ended, and reaped: no zombie is left
        os.waitpid(pids[0], os.WNOHANG)
    monkeypatch.setattr(Lane, "write", write)
    assert run_cli(*command).exit_code in (0, WAITING)
    rows = read_csv(folder / "run" / "judgments.csv")
    assert Counter(row["qa_id"] for row in rows).most_common(1)[0][1] == 1
    assert {row["qa_id"]: row for row in rows} == alone


CHILD_SLEEPS = """
import os, sys, time
from ragexam.stages import forked
forked.ROWS_TO_FORK, forked.cores = 8, lambda: 2
alone = forked._alone
def slow(parent, mask):
    alone(parent, mask)  # from here on, the parent's death is the child's
    with open(os.environ["PID_FILE"], "w") as out:
        out.write(str(os.getpid()))
    time.sleep(60)
forked._alone = slow
from ragexam.cli import main
sys.argv = ["ragexam", *sys.argv[1:]]
main()
"""


@LINUX
@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM])
def test_a_child_ends_with_its_parent_killed_or_stopped_as_it_waits(
    env: FakeOpenAI, tmp_path: Path, sent: signal.Signals
) -> None:
    """A child that takes a minute: its parent killed, it dies with it; its parent, its rows
    done and waiting on it, sent SIGTERM (a cancel of the stage's task), ends the wait and
    the child within seconds, and exits 130."""
    env.responder = grades
    command = answered(env, tmp_path, 80)
    pid_file = tmp_path / "child.pid"
    environment = {**os.environ, "PID_FILE": str(pid_file)}
    parent = subprocess.Popen([sys.executable, "-c", CHILD_SLEEPS, *command], env=environment)
    try:
        child = child_pid(pid_file, parent)
        time.sleep(0.5)  # the parent's share is a few dozen rows: it waits by now
        os.kill(parent.pid, sent)
        assert parent.wait(timeout=50) == (-sent if sent == signal.SIGKILL else 130)
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the child outlived its parent's end"
            time.sleep(0.05)
    finally:
        parent.kill()
    assert run_cli(*command).exit_code in (0, WAITING)  # the rerun merges every result
    assert len(read_csv(tmp_path / "run" / "judgments.csv")) == 72


def child_pid(pid_file: Path, parent: subprocess.Popen[bytes]) -> int:
    """The pid a forked child writes once its own handlers are set, while its parent runs."""
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    return int(pid_file.read_text())


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended and not yet reaped by init, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def refusing(body: dict[str, Any]) -> Reply:
    """The grades, but question #10's line says the structured-output method is unsupported:
    the rows after it ask again under the next method (what one process does)."""
    if number(body, "Question") == 10:
        return Reply(
            status=500, error_message="Invalid response_format: json_schema is not supported"
        )
    return grades(body)


def asked(folder: Path) -> set[str]:
    """The custom_ids of the requests waiting under the folder's files/requests/."""
    return {
        json.loads(line)["custom_id"]
        for path in (folder / "files" / "requests").glob("*.jsonl")
        for line in path.read_text(encoding="utf-8").splitlines()
    }


@LINUX
@pytest.mark.parametrize("cores", [2, 3])  # a child's first row read, or left to the parent
def test_children_read_no_row_once_this_process_asks_otherwise(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    env.responder = refusing
    n = 96
    alone, children = alone_then_many(env, tmp_path, monkeypatch, n, cores)
    assert merged(env, tmp_path / "forked", n) == alone  # rows of the children's asked again
    assert asked(tmp_path / "forked") == asked(tmp_path / "alone")
    assert len(asked(tmp_path / "alone")) > n / 2 and children[True] == cores - 1


CTRL_C_SOON = """
import os, sys, time
from ragexam.stages import bulk, forked
forked.ROWS_TO_FORK, forked.cores = 8, lambda: 2
alone, write = forked._alone, bulk.Lane.write
def told(parent, mask):
    alone(parent, mask)
    with open(os.environ["PID_FILE"], "w") as out:
        out.write(str(os.getpid()))
def slow(self, *args):
    time.sleep(0.002)
    write(self, *args)
forked._alone, bulk.Lane.write = told, slow
from ragexam.cli import main
sys.argv = ["ragexam", *sys.argv[1:]]
main()
"""


@LINUX
def plain(body: dict[str, Any]) -> Reply:
    """Grades every one of which the bulk lane reads: rows that await nothing."""
    i = number(body, "Question")
    return Reply(content=json.dumps({"reasoning": "r", "completeness": 0.5, "conciseness": i % 2}))


@LINUX
def test_ctrl_c_stops_the_merge_soon_and_ends_its_children(env: FakeOpenAI, tmp_path: Path) -> None:
    env.responder = plain
    n = 3000
    command = answered(env, tmp_path, n)
    pid_file = tmp_path / "child.pid"
    environment = {**os.environ, "PID_FILE": str(pid_file)}
    parent = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SOON, *command], env=environment, start_new_session=True
    )
    try:
        child = child_pid(pid_file, parent)
        os.killpg(parent.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to every process
        assert parent.wait(timeout=60) == 130
    finally:
        parent.kill()
    assert not _alive(child)
    written = len(read_csv(tmp_path / "run" / "judgments.csv"))
    assert 0 < written < n / 2  # it stopped within its own share, a thousand rows at most on
    assert run_cli(*command).exit_code in (0, WAITING)
    rows = read_csv(tmp_path / "run" / "judgments.csv")
    assert len(rows) == len({row["qa_id"] for row in rows}) == n


@pytest.mark.parametrize("before", [False, True])
def test_what_was_frozen_before_children_stays_frozen(before: bool) -> None:
    """The command line freezes what it built; children unfreeze only what they froze."""
    import gc

    if before:
        gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with forked.shared():
            assert gc.get_freeze_count() >= max(frozen, 1)
        assert (gc.get_freeze_count() >= frozen > 0) if before else gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
