"""Benchmark the batch road: a million judge rows to shards and back, and batch against sync.

    uv run python bench/bench_batch.py [--rows 1000000] [--compare 10000] [--folder DIR]

Part 1, at --rows: the judge's inputs are bench_stats' synthetic run (qa_dataset.csv and
answers.csv, the columns and text sizes ragexam writes). In fresh child processes it times
`pandas.read_csv` of both (the best of three: the smallest denominator, the strictest target);
`ragexam judge --batch-dir` writing the request shards; and the same command merging one
result line per request (written here as OpenAI's Batch API writes them).
Each figure is the batch road's own: from its first row to its last, and the peak resident
memory it adds over what the stage held when it began (the exam and the answers, read by the
judge whichever road it takes); the whole command's time and peak are printed beside. Targets:
shards ÷ read_csv ≤ 2, merge ÷ read_csv ≤ 3, each peak ≤ that of `stats` at the same rows.

Both roads fork a child a spare core (stages/forked.py); their figures count the children's
memory, the pages they copied, beside this process's. The same merge in one process is timed
again after it, to say what the children gain. Beside them, each road's floor
(measure_floor): its essential steps alone in a tight loop, in one process.

Part 2, at --compare rows: the same exam judged on the unit scale (the test server's grades)
through the test server's Batch API and through the sync road: calls and tokens identical, cost
at most half (gpt-4o-mini's table prices).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pandas as pd
from bench_stats import _maxrss_mb, timed, write_run
from common import ROOT, FakeOpenAI, run_stage

JUDGE_INPUTS = ("qa_dataset.csv", "answers.csv")
READS = 3  # read_csv is timed this many times, and the best taken: on this VM, 4.2-7.0 s
REPLY = {
    "reasoning": "The answer has the ground truth's two facts, and one more.",
    "conciseness": 0.7,
}


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure_road(run: Path, files: Path, trace: bool = False, alone: bool = False) -> None:
    """In a fresh process: `ragexam judge --batch-dir`, the road's own seconds and peak
    (with `trace`, and slower: the peak of what the road allocated, by tracemalloc; with
    `alone`, in this process only: no forked child reads results on another core).

    The children's memory is their private pages (smaps_rollup): the pages they copied from
    this process by writing to them, and what they allocated; the pages they only read are
    this process's. `together_mb` is the peak of this process's growth and its children's
    private memory at the same moment, sampled every 0.3 s (or this process's own peak,
    when higher)."""
    import ragexam
    from ragexam.errors import BatchPending
    from ragexam.stages import batch, forked

    real, figures = batch.drive, {}
    if alone:
        forked.ROWS_TO_FORK = 1 << 62
    start, made = forked.Child.start, []

    def counted(*args: Any, **kwargs: Any) -> None:
        start(*args, **kwargs)
        made.append(args[4][-1])  # the child it put into the list of those to stop

    forked.Child.start = counted  # type: ignore[method-assign]

    async def drive(*args: Any) -> None:
        figures["reading_mb"] = _maxrss_mb()  # the peak before the road: reading the inputs
        _forget_peak()  # ... forgotten, to see the road's own
        before, started = _rss_mb(), time.perf_counter()
        if trace:
            tracemalloc.start()
        with _sampled(before, made) as peak:
            await real(*args)
        seconds = time.perf_counter() - started
        mb = _maxrss_mb() - before
        figures.update(seconds=seconds, mb=mb, children=len(made), children_mb=peak["children"])
        figures["together_mb"] = max(peak["together"], mb)
        if trace:  # what the road allocated at its peak, whether or not the RSS had room
            figures["traced_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()

    batch.drive = drive  # type: ignore[assignment]
    started, floor = time.perf_counter(), _maxrss_mb()
    with contextlib.suppress(BatchPending):  # requests wait: what the first run ends with
        ragexam.judge(out=run, controls=0, batch_dir=files, concurrency=1)
    peak = max(_maxrss_mb(), figures.pop("reading_mb", 0.0))
    whole = {"whole_seconds": time.perf_counter() - started, "whole_mb": peak - floor}
    print(json.dumps({**figures, **whole}))


@contextlib.contextmanager
def _sampled(before: float, children: list[Any]) -> Any:
    """The peak, while the block runs, of the children's private memory (MB), and of this
    process's growth over `before` and theirs at the same moment."""
    import threading

    peak, done = {"children": 0.0, "together": 0.0}, threading.Event()

    def sample() -> None:
        while not done.wait(0.3):
            pids = [child.pid for child in children if child is not None and child.pid]
            if pids:
                private = sum(_private_mb(pid) for pid in pids)
                peak["children"] = max(peak["children"], private)
                peak["together"] = max(peak["together"], _rss_mb() - before + private)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def _private_mb(pid: int) -> float:
    """A process's private memory (MB): the pages no other process maps."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:  # it has ended
        return 0.0
    fields = ("Private_Clean:", "Private_Dirty:")
    return sum(int(line.split()[1]) for line in lines if line.startswith(fields)) / 1024


def _forget_peak() -> None:
    """Reset this process's peak resident memory to what it holds now (Linux 4.0 and later)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure_read(run: Path) -> None:
    """In a fresh process: read_csv of the judge's two inputs."""
    before, started = _maxrss_mb(), time.perf_counter()
    frames = [pd.read_csv(run / name) for name in JUDGE_INPUTS]
    print(json.dumps({"seconds": time.perf_counter() - started, "mb": _maxrss_mb() - before}))
    del frames


def measure_floor(run: Path, files: Path) -> None:
    """In a fresh process: the floor of each road, its essential steps a row alone in one
    tight loop, on the same rows and the requests and results the road wrote and read.

    Shards: neutralise and JSON-escape the three texts, fill the body's form, hash it, make
    the request line and its id (written to nothing: the road writes from another thread).
    Merge: parse a result line, find its row, render the body again and check its digest,
    validate the grade, hash the row's input, write its CSV row.
    What the road does beside (the ledger, the runner's row log and counts, re-asks and
    retries, carried and late results) is left out: this is what no design can skip."""
    import csv
    import hashlib
    import io
    from json.encoder import encode_basestring

    import orjson

    from ragexam.io.fingerprint import input_hash
    from ragexam.llm.prompts import neutralise
    from ragexam.stages.grading import UnitGrade

    qa = pd.read_csv(run / "qa_dataset.csv", usecols=["qa_id", "question", "ground_truth_answer"])
    answers = pd.read_csv(run / "answers.csv", usecols=["qa_id", "answer", "status"])
    both = answers[answers.status == "ok"].merge(qa, on="qa_id")
    columns = ("qa_id", "question", "ground_truth_answer", "answer")
    rows = list(zip(*(both[name].fillna("").astype(str) for name in columns), strict=True))
    by_key = {row[0]: row for row in rows}
    shards = sorted((files / "requests" / "done").glob("*.jsonl"))
    segments, head = _form_of(shards[0], by_key)
    state = hashlib.blake2b(head, digest_size=8)

    def rest_of(row: tuple[str, ...]) -> bytes:
        texts = (encode_basestring(neutralise(text))[1:-1] for text in row[1:])
        return "".join(part for pair in zip(texts, segments, strict=True) for part in pair).encode()

    url = encode_basestring("/v1/chat/completions").encode()
    out = files / "floor"
    out.mkdir(exist_ok=True)
    started = time.perf_counter()
    # the lines to nothing: the road writes its shards from another thread, so its floor is the
    # CPU of its rows (what the disk takes, the road's own time shows: on this VM, 0.5-6.5 s)
    nowhere = Path(os.devnull)
    with nowhere.open("wb") as lines, nowhere.open("w") as ids:
        for row in rows:
            rest = rest_of(row)
            digest = state.copy()
            digest.update(rest)
            identifier = f"judge~0~{digest.hexdigest()}~{row[0]}"
            head_of_line = f'{{"custom_id":{encode_basestring(identifier)},"method":"POST","url":'
            lines.write(b"".join((head_of_line.encode(), url, b',"body":', head, rest, b"}\n")))
            ids.write(identifier + "\n")
    shard_seconds = time.perf_counter() - started

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    merged = 0
    started = time.perf_counter()
    with (out / "judgments.csv").open("w") as table:
        for path in sorted((files / "results").glob("*.jsonl")):
            with path.open("rb") as results:
                for line in results:
                    data = orjson.loads(line)
                    _, _, digest_was, key = data["custom_id"].split("~", 3)
                    row = by_key[key]
                    digest = state.copy()
                    digest.update(rest_of(row))
                    if digest.hexdigest() != digest_was:
                        raise SystemExit(f"the floor renders another body than the road: {key}")
                    body = data["response"]["body"]
                    usage, reply = body["usage"], body["choices"][0]["message"]["content"]
                    grade = UnitGrade.model_validate_json(reply)
                    hashed = input_hash(*row[1:])
                    buffer.seek(0)
                    buffer.truncate()
                    tokens = (usage["prompt_tokens"], usage["completion_tokens"])
                    grades = (grade.completeness, grade.conciseness, "", "", 1, 1, "unit", 0.0)
                    empty = ("",) * 8
                    run_columns = ("ok", "", "gpt-4o-mini", "x", hashed, *tokens, 1, 0.0, "")
                    writer.writerow((key, *grades, "false", grade.reasoning, *empty, *run_columns))
                    table.write(buffer.getvalue())
                    merged += 1
    merge_seconds = time.perf_counter() - started
    print(json.dumps({"shards": shard_seconds, "merge": merge_seconds, "rows": merged}))


def _form_of(shard: Path, rows: dict[str, tuple[str, ...]]) -> tuple[list[str], bytes]:
    """The judge body's form, cut from a request the road wrote at the row's three texts: the
    segments after each text, and the head before the first (as llm/requests.py keeps it)."""
    from json.encoder import encode_basestring

    from ragexam.llm.prompts import neutralise

    with shard.open("rb") as lines:
        line = lines.readline()
    key = json.loads(line)["custom_id"].split("~", 3)[3]
    body = line[line.index(b',"body":') + len(b',"body":') : -2].decode()
    cuts, at = [], 0
    for text in rows[key][1:]:
        escaped = encode_basestring(neutralise(text))[1:-1]
        start = body.index(escaped, at)
        cuts.append((start, start + len(escaped)))
        at = start + len(escaped)
    starts = [start for start, _ in cuts[1:]] + [len(body)]
    segments = [body[end:start] for (_, end), start in zip(cuts, starts, strict=True)]
    return segments, body[: cuts[0][0]].encode()


def child(action: str, *paths: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--measure", action, *map(str, paths)]
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=_env())
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGEXAM_"))}
    return {**env, "RAGEXAM_MODEL": "gpt-4o-mini", "PYTHONPATH": str(ROOT / "bench")}


def answer_everything(files: Path) -> int:
    """One OpenAI-shaped result line per request line, as the Batch API writes them."""
    results = files / "results"
    results.mkdir(parents=True, exist_ok=True)
    count = 0
    for path in sorted((files / "requests").glob("*.jsonl")):
        with path.open("rb") as source, (results / path.name).open("w") as out:
            for line in source:
                custom_id = json.loads(line[: line.index(b',"method"')] + b"}")["custom_id"]
                out.write(_result(custom_id, count) + "\n")
                count += 1
    return count


def _result(custom_id: str, n: int) -> str:
    grade = {**REPLY, "completeness": (n % 11) / 10}
    message = {"role": "assistant", "content": json.dumps(grade), "refusal": None}
    body = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 1760000000,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 420, "completion_tokens": 31, "total_tokens": 451},
    }
    response = {"status_code": 200, "request_id": f"req_{n}", "body": body}
    return json.dumps(
        {"id": f"batch_req_{n}", "custom_id": custom_id, "response": response, "error": None}
    )


def part_one(folder: Path, rows: int, trace: bool) -> None:
    if not (folder / "qa_dataset.csv").exists():
        write_run(folder, rows, max(rows // 200, 1))
    run, files = folder / "judge-run", folder / "batch"
    for old in (run, files):  # a reused folder: from scratch, but for the inputs
        shutil.rmtree(old, ignore_errors=True)
    run.mkdir()
    for name in JUDGE_INPUTS:
        target = run / name
        if not target.exists():
            target.symlink_to(folder / name)
    os.sync()  # the inputs just written go down now, not while they are read
    reads = [child("read", run) for _ in range(READS)]
    read = min(reads, key=lambda figures: figures["seconds"])  # the best: the strictest target
    _say("read_csv of the two inputs", read)
    print(
        f"{'  (each of ' + str(READS) + ')':<34} " + ", ".join(f"{r['seconds']:.2f}" for r in reads)
    )
    shards = child("road", run, files)
    _say("writing the request shards", shards)
    lines = answer_everything(files)
    merge = child("road", run, files)
    _say(f"merging {lines:,} result lines", merge)
    floor = child("floor", run, files)  # each road's essential steps alone, on the same rows
    _again(run, files)
    alone = child("road-alone", run, files)  # the same merge, in one process: no child
    _say("the same, in one process", alone)
    print(f"{'floor: the shards':<34} {floor['shards']:7.2f} s")
    print(f"{'floor: the merge':<34} {floor['merge']:7.2f} s", flush=True)
    if trace:  # again, each under tracemalloc: what the road itself allocates at its peak
        _again(run, files, shards=False)
        traced = child("trace", run, files)["traced_mb"]
        answer_everything(files)
        merged = child("trace", run, files)["traced_mb"]
        print(f"traced by the road: shards {traced:.0f} MB, merge {merged:.0f} MB", flush=True)
    _, stats_mb = timed("stats", folder)
    print(f"stats peak RSS +{stats_mb:.0f} MB (bench_stats' run at {rows:,} rows)")
    print(f"shards / read_csv = {shards['seconds'] / read['seconds']:.2f} (target <= 2)")
    print(f"merge  / read_csv = {merge['seconds'] / read['seconds']:.2f} (target <= 3)")
    print(f"merge in one process / read_csv = {alone['seconds'] / read['seconds']:.2f}")
    print(
        f"peaks: shards +{shards['mb']:.0f} MB and their children "
        f"+{shards.get('children_mb', 0.0):.0f} MB, +{shards['together_mb']:.0f} MB at once; "
        f"merge +{merge['mb']:.0f} MB and its children +{merge.get('children_mb', 0.0):.0f} MB, "
        f"+{merge['together_mb']:.0f} MB at once (target <= stats)"
    )
    print(
        f"floors / read_csv: shards {floor['shards'] / read['seconds']:.2f}, "
        f"merge {floor['merge'] / read['seconds']:.2f}"
    )


def _again(run: Path, files: Path, shards: bool = True) -> None:
    """The run folder as before the shards were written (and, with `shards`, as before the
    merge: its shards written again and every request answered)."""
    for old in (run / "batches", files):
        shutil.rmtree(old, ignore_errors=True)
    for old in (run / "judgments.csv", run / "manifest.json"):
        old.unlink(missing_ok=True)
    if shards:
        child("road", run, files)
        answer_everything(files)


def _say(what: str, figures: dict[str, float]) -> None:
    whole = (
        f"; whole command {figures['whole_seconds']:.1f} s, +{figures['whole_mb']:.0f} MB"
        if "whole_seconds" in figures
        else ""
    )
    children = (
        f"; {figures['children']:.0f} forked, +{figures['children_mb']:.0f} MB"
        if figures.get("children")
        else ""
    )
    print(
        f"{what:<34} {figures['seconds']:7.2f} s  peak +{figures['mb']:5.0f} MB{children}{whole}",
        flush=True,
    )


def part_two(rows: int) -> None:
    from bench_judge import write_exam

    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as server:
        env = {**_env(), "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        env |= {"RAGEXAM_BATCH_POLL": "0.2", "RAGEXAM_JUDGE_MODEL": "gpt-4o-mini"}
        records = {}
        for road in ("sync", "batch"):
            write_exam(Path(tmp) / road, rows)
            options = ["judge", "--scale", "unit", "--controls", "0", "--concurrency", "32"]
            options += ["--batch"] if road == "batch" else []
            records[road] = run_stage(env, Path(tmp) / road, options)
        calls = {"sync": server.count(), "batch": len(server.batch_requests)}
    sync, batch = records["sync"], records["batch"]
    print(f"{rows:,} rows: calls sync {calls['sync']:,}, batch {calls['batch']:,}")
    print(f"  tokens billed: sync {sync['tokens_billed']}, batch {batch['tokens_billed']}")
    print(f"  cost: sync ${sync['cost_usd']:.4f}, batch ${batch['cost_usd']:.4f}")
    print(f"  batch / sync cost = {batch['cost_usd'] / sync['cost_usd']:.3f} (target <= 0.5)")
    print(f"  wall: sync {sync['seconds']:.1f} s, batch {batch['seconds']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--compare", type=int, default=10_000)
    parser.add_argument("--folder", type=Path, help="reuse (or keep) the inputs here")
    parser.add_argument("--trace", action="store_true", help="also trace the road's allocations")
    parser.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        action, *paths = args.measure
        if action == "read":
            return measure_read(Path(paths[0]))
        if action == "floor":
            return measure_floor(Path(paths[0]), Path(paths[1]))
        trace, alone = action == "trace", action == "road-alone"
        return measure_road(Path(paths[0]), Path(paths[1]), trace=trace, alone=alone)
    with tempfile.TemporaryDirectory() as tmp:
        part_one(args.folder or Path(tmp), args.rows, args.trace)
    if args.compare:  # --compare 0: part one alone
        part_two(args.compare)


if __name__ == "__main__":
    main()
