"""Benchmark `ragexam stats` on a synthetic run against `pandas.read_csv` of the same files.

    uv run python bench/bench_stats.py [--rows 1000000] [--documents 5000] [--repeat 2]
                                       [--folder DIR] [--busy] [--baseline SRC]

It writes the three CSVs with every column ragexam writes (realistic text lengths, judge scores
on a 0.1 grid, ranks 1..5 or a miss, about 1% error rows in each stage, rows in completion
order; 5% multi-hop questions, two chunks each ranked in `target_ranks`, and 2% unanswerable
ones), or reuses those in --folder. Then, in the same run, it times `pandas.read_csv` of the
three files (all columns, defaults) and `run_stats` (both summaries and report.html), each in a
fresh child process so that each peak of resident memory is its own, and prints the best time
of each, their ratio (target: at most 2.0) and the peak memory each adds. With --busy it
times both again while another process keeps one core busy (numpy's BLAS then must not wait on
a second thread of its own; see resampling.one_blas_thread). With --baseline SRC (the `src`
folder of another ragexam, e.g. `git archive main src | tar -x -C /tmp/main`) it also times
that version's `run_stats` on the same files, alternating, and prints new / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

import ragexam

FILES = ("qa_dataset.csv", "answers.csv", "judgments.csv")
ERROR_SHARE = 0.01
MULTI_HOP_SHARE, UNANSWERABLE_SHARE = 0.05, 0.02


def _ids(rng: np.random.Generator, rows: int) -> pd.Series:
    """Random-looking qa ids of 16 hex digits, as generate's hashes are (not sorted)."""
    return pd.Series([f"{value:016x}" for value in rng.integers(0, 2**63, rows).tolist()])


def _status(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.where(rng.random(rows) < ERROR_SHARE, "error", "ok")


def _runner_columns(frame: pd.DataFrame, rng: np.random.Generator, model: str) -> None:
    """The columns the runner adds to every stage, errors with a reason and empty values."""
    rows = len(frame)
    error = frame["status"] == "error"
    frame["error"] = np.where(error, "LLMError: 500 Internal Server Error after 3 attempts", "")
    frame["model"] = model
    frame["prompt_hash"] = "3f2a9c1b7d4e"
    frame["prompt_tokens"] = rng.integers(200, 900, rows)
    frame["completion_tokens"] = rng.integers(20, 200, rows)
    frame["attempts"] = 1
    frame["latency_s"] = rng.random(rows).round(3)
    frame["raw_reply"] = ""


def _kinds(rng: np.random.Generator, rows: int) -> np.ndarray:
    """single, multi-hop or unanswerable, in the shares above."""
    shares = [1 - MULTI_HOP_SHARE - UNANSWERABLE_SHARE, MULTI_HOP_SHARE, UNANSWERABLE_SHARE]
    return rng.choice(np.array(["single", "multi-hop", "unanswerable"]), rows, p=shares)


def _qa(
    ids: pd.Series, kinds: np.ndarray, rng: np.random.Generator, documents: int
) -> pd.DataFrame:
    rows = len(ids)
    weight = rng.lognormal(0, 1, documents)  # a few long documents, many short ones
    doc = rng.choice(documents, rows, p=weight / weight.sum())
    names = np.array([f"docs/manual_{d:05d}.pdf" for d in range(documents)], dtype=object)
    chunk = "chunk-" + ids
    chunk_ids = np.select(
        [kinds == "single", kinds == "multi-hop"],
        ['["' + chunk + '"]', '["' + chunk + '", "' + chunk + '-b"]'],
        "[]",
    )
    frame = pd.DataFrame(
        {
            "qa_id": ids,
            "chunk_id": np.where(kinds == "unanswerable", "", chunk),
            "kind": kinds,
            "chunk_ids": chunk_ids,
            "document": names[doc],
        }
    )
    frame["question"] = "What does section " + ids.str[:6] + " say about the warranty period?"
    frame["ground_truth_answer"] = (
        "The warranty lasts two years from delivery and covers parts and labour, "
        "except for wear items listed in section " + ids.str[:4] + "."
    )
    frame["truncated"] = "false"
    frame["chunk_chars"] = rng.integers(300, 2000, rows)
    frame["status"] = _status(rng, rows)
    _runner_columns(frame, rng, "gpt-4o-mini")
    blank = frame["status"] == "error"
    frame.loc[blank, ["question", "ground_truth_answer"]] = ""
    return frame


def _answers(ids: pd.Series, kinds: np.ndarray, rng: np.random.Generator, k: int) -> pd.DataFrame:
    rows = len(ids)
    shares = [0.2, 0.4, 0.15, 0.1, 0.08, 0.07]
    rank = rng.choice(np.arange(0, k + 1), size=rows, p=shares)
    second = rng.choice(np.arange(0, k + 1), size=rows, p=shares)
    second = np.where(second == rank, 0, second)  # one retrieved chunk is one source at most
    single = pd.Series(rank).astype(str).where(rank > 0, "null")
    other = pd.Series(second).astype(str).where(second > 0, "null")
    ranks = np.select(
        [kinds == "single", kinds == "multi-hop"],
        ["[" + single + "]", "[" + single + ", " + other + "]"],
        "[]",
    )
    missed = k + 1
    best = np.minimum(np.where(rank > 0, rank, missed), np.where(second > 0, second, missed))
    rank = np.where(kinds == "multi-hop", np.where(best == missed, 0, best), rank)
    rank = np.where(kinds == "unanswerable", 0, rank)
    frame = pd.DataFrame({"qa_id": ids})
    frame["answer"] = (
        "According to the manual, the warranty period is two years from delivery; it covers "
        "parts and labour. Wear items are excluded (see section " + ids.str[:4] + ")."
    )
    frame["retrieved_ids"] = '["chunk-' + ids + '", "chunk-a1", "chunk-b2", "chunk-c3", "chunk-d4"]'
    frame["target_rank"] = pd.Series(rank).astype("Int64").where(rank > 0)
    frame["target_ranks"] = ranks
    frame["k"], frame["rag"] = k, "builtin"
    frame["status"] = _status(rng, rows)
    _runner_columns(frame, rng, "gpt-4o-mini")
    blank = frame["status"] == "error"
    frame.loc[blank, ["answer", "retrieved_ids", "target_ranks"]] = ""
    frame.loc[blank, "target_rank"] = pd.NA
    return frame


def _judgments(ids: pd.Series, rng: np.random.Generator) -> pd.DataFrame:
    rows = len(ids)
    frame = pd.DataFrame({"qa_id": ids})
    frame["completeness"] = np.clip(rng.beta(5, 2, rows), 0, 1).round(1)
    frame["conciseness"] = np.clip(rng.beta(4, 2, rows), 0, 1).round(1)
    frame["status"] = _status(rng, rows)
    _runner_columns(frame, rng, "gpt-4o")
    blank = frame["status"] == "error"
    frame.loc[blank, ["completeness", "conciseness"]] = np.nan
    return frame


def write_run(folder: Path, rows: int, documents: int, seed: int = 0, k: int = 5) -> None:
    """The three CSVs of a synthetic run, with the columns and text sizes ragexam writes."""
    rng = np.random.default_rng(seed)
    ids = _ids(rng, rows)
    kinds = _kinds(rng, rows)
    folder.mkdir(parents=True, exist_ok=True)
    _qa(ids, kinds, rng, documents).to_csv(folder / FILES[0], index=False)
    order = rng.permutation(rows)  # rows land in completion order, not question order
    _answers(ids, kinds, rng, k).iloc[order].to_csv(folder / FILES[1], index=False)
    _judgments(ids, rng).iloc[rng.permutation(rows)].to_csv(folder / FILES[2], index=False)


def _maxrss_mb() -> float:
    """This process's own peak resident memory.

    VmHWM, not ru_maxrss: on Linux ru_maxrss carries the parent's peak across fork and exec,
    so a child started by a large parent would report no growth at all.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_all(folder: Path) -> None:
    """What the ratio is measured against: read_csv of the three files, all columns."""
    frames = [pd.read_csv(folder / name) for name in FILES]
    del frames


def measure(action: str, folder: Path) -> None:
    """In a fresh process: seconds taken and peak resident memory added, as JSON."""
    work: Callable[[], object] = (
        (lambda: ragexam.stats(out=folder)) if action != "read_csv" else lambda: read_all(folder)
    )
    before = _maxrss_mb()
    start = time.perf_counter()
    work()
    print(json.dumps({"seconds": time.perf_counter() - start, "mb": _maxrss_mb() - before}))


def timed(action: str, folder: Path, source: Path | None = None) -> tuple[float, float]:
    """Run `measure` in a child, so that each peak is its own (ru_maxrss never falls); with
    `source`, the ragexam of that `src` folder is imported instead of this one."""
    command = [sys.executable, __file__, "--measure", action, "--folder", str(folder)]
    env = {**os.environ, "PYTHONPATH": str(source)} if source is not None else None
    run = subprocess.run(command, check=True, capture_output=True, env=env)
    figures = json.loads(run.stdout)
    print(
        f"{action:<10} {figures['seconds']:7.2f} s   peak RSS +{figures['mb']:6.0f} MB", flush=True
    )
    return float(figures["seconds"]), float(figures["mb"])


def main() -> None:
    """Generate, time read_csv and stats, print the ratio and memory."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--documents", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=2, help="take the best of this many")
    parser.add_argument("--folder", type=Path, help="reuse (or keep) the CSVs here")
    parser.add_argument(
        "--busy", action="store_true", help="also time them while a process spins on one core"
    )
    parser.add_argument(
        "--baseline", type=Path, help="also time the ragexam of this src folder's stats"
    )
    parser.add_argument(
        "--measure", choices=["stats", "baseline", "read_csv"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.measure:
        return measure(args.measure, args.folder)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "run"
        if not (folder / FILES[0]).exists():
            write_run(folder, args.rows, args.documents)
        rows = sum(1 for _ in (folder / FILES[0]).open("rb")) - 1
        size = sum((folder / name).stat().st_size for name in FILES) / 2**20
        print(f"{rows:,} questions, three CSVs of {size:,.0f} MB", flush=True)
        best = best_of(folder, args.repeat, args.baseline)
        read, stats = best["read_csv"], best["stats"]
        print(
            f"stats / read_csv = {stats[0] / read[0]:.2f} (target <= 2.0); stats peak RSS "
            f"+{stats[1]:.0f} MB ({stats[1] * 2**20 / rows:,.0f} bytes per question), "
            f"read_csv +{read[1]:.0f} MB"
        )
        if "baseline" in best:
            base = best["baseline"]
            print(
                f"stats / baseline stats = {stats[0] / base[0]:.2f} in time, "
                f"{stats[1] / base[1]:.2f} in peak RSS (baseline: {args.baseline})"
            )
        if args.busy:
            print("while another process keeps one core busy:", flush=True)
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                best = best_of(folder, args.repeat)
                read, stats = best["read_csv"], best["stats"]
            finally:
                spinner.kill()
                spinner.wait()
            print(f"stats / read_csv = {stats[0] / read[0]:.2f} with a busy core (target <= 2.0)")


def best_of(
    folder: Path, repeat: int, baseline: Path | None = None
) -> dict[str, tuple[float, float]]:
    """The best seconds and memory of read_csv, stats and the baseline's stats (if given), over
    `repeat` runs of each in turn, so that all see the machine alike."""
    actions = [("read_csv", None), ("stats", None)]
    actions += [("baseline", baseline)] if baseline is not None else []
    runs: dict[str, list[tuple[float, float]]] = {action: [] for action, _ in actions}
    for _ in range(repeat):
        for action, source in actions:
            runs[action].append(timed(action, folder, source))
    return {action: min(figures) for action, figures in runs.items()}


if __name__ == "__main__":
    main()
