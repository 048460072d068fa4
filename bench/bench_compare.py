"""Benchmark `ragexam compare` on two synthetic runs against `pandas.read_csv` of the same files.

    uv run python bench/bench_compare.py [--rows 100000] [--documents 1000] [--repeat 2]

Run A is bench_stats' synthetic run; run B has the same exam and answers, and judgments whose
completeness moved by -0.1, 0 or +0.1 at random. In the same run it times `pandas.read_csv` of
the six files (all columns, defaults) and `run_compare`, alternately, and prints the best time
of each and their ratio (target: at most 3).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from bench_stats import FILES, write_run

from ragexam.analysis.compare import run_compare


def write_runs(root: Path, rows: int, documents: int) -> tuple[Path, Path]:
    """Run A, and run B: the same exam with completeness moved by one step on a third of rows."""
    a, b = root / "a", root / "b"
    write_run(a, rows, documents)
    b.mkdir()
    for name in FILES[:2]:
        shutil.copy(a / name, b / name)
    judgments = pd.read_csv(a / FILES[2], dtype={"qa_id": str})
    step = np.random.default_rng(1).choice([-0.1, 0.0, 0.1], len(judgments))
    judgments["completeness"] = (judgments["completeness"] + step).clip(0, 1).round(1)
    judgments.to_csv(b / FILES[2], index=False)
    return a, b


def timed(action: str, a: Path, b: Path, out: Path) -> float:
    """Seconds taken by one read_csv of the six files, or one compare."""
    start = time.perf_counter()
    if action == "compare":
        run_compare(a, b, out)
    else:
        frames = [pd.read_csv(run / name) for run in (a, b) for name in FILES]
        del frames
    seconds = time.perf_counter() - start
    print(f"{action:<9} {seconds:7.2f} s", flush=True)
    return seconds


def main() -> None:
    """Generate two runs, time read_csv and compare, print the ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2, help="take the best of this many")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = write_runs(Path(tmp), args.rows, args.documents)
        print(f"two runs of {args.rows:,} questions over {args.documents:,} documents", flush=True)
        times: dict[str, list[float]] = {"read_csv": [], "compare": []}
        for _ in range(args.repeat):
            for action in times:
                times[action].append(timed(action, a, b, Path(tmp) / "out"))
        read, compare = min(times["read_csv"]), min(times["compare"])
        print(f"compare / read_csv = {compare / read:.2f} (target <= 3)")


if __name__ == "__main__":
    main()
