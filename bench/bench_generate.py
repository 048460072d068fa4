"""Benchmark `ragexam generate` against the fake server with a set latency per call.

    uv run python bench/bench_generate.py [--rows 1000] [--concurrency 32] [--latency 0.2]
                                          [--baseline SRC] [--repeat N]

It prints rows/s, the ceiling (concurrency / latency) and their ratio, and the ratio to a
bare `openai.AsyncOpenAI` loop sending the same requests at the same concurrency, measured
in the same run. Both clients run in their own process; the server runs in this one. With
--baseline SRC (the `src` folder of another ragexam, e.g. `git archive main src | tar -x -C
/tmp/main`) it also runs that version's generate on the same store, alternating with this
one --repeat times, and prints the best rows/s of each and their ratio.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from common import FakeOpenAI, arguments, print_rates, run_bare, run_stage


def build_store(path: Path, rows: int) -> None:
    """A store of `rows` chunks with explicit embeddings (no model download)."""
    import chromadb

    collection = chromadb.PersistentClient(str(path)).create_collection("bench")
    for start in range(0, rows, 1000):
        ids = [f"chunk-{i:06d}" for i in range(start, min(start + 1000, rows))]
        collection.add(
            ids=ids,
            embeddings=[[float(i % 7), 1.0, 0.5] for i in range(len(ids))],
            documents=[f"Fact {i}: widget {i} weighs {i * 3} grams." for i in ids],
            metadatas=[{"source": f"doc{hash(i) % 20}.md"} for i in ids],
        )


def main() -> None:
    """Run both clients once (or this and the baseline's generate in turn) and print."""
    parser = arguments()
    parser.add_argument("--baseline", type=Path, help="also run the ragexam of this src folder")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, the best kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(latency=args.latency) as server:
        build_store(Path(tmp) / "store", args.rows)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        command = ["generate", "--chroma", str(Path(tmp) / "store")]
        command += ["--concurrency", str(args.concurrency)]
        versions = {"this": env}
        if args.baseline is not None:
            versions["baseline"] = {**env, "PYTHONPATH": str(args.baseline.resolve())}
        records: dict[str, list[dict[str, Any]]] = {name: [] for name in versions}
        for turn in range(args.repeat):
            for name, where in versions.items():
                records[name].append(run_stage(where, Path(tmp) / f"{name}-{turn}", command))
        bare = run_bare(env, dict(server.requests[0].body), args.rows, args.concurrency)
    best = {
        name: max(found, key=lambda r: float(r["rows_per_second"]))
        for name, found in records.items()
    }
    rate = float(best["this"]["rows_per_second"])
    print_rates("generate", args, rate, bare)
    print(
        f"  ragexam process CPU per row, start-up included: "
        f"{1000 * best['this']['cpu_seconds'] / args.rows:.1f} ms"
    )
    if "baseline" in best:
        base = float(best["baseline"]["rows_per_second"])
        print(
            f"  baseline  {base:7.1f} rows/s ({args.baseline}); this / baseline = {rate / base:.3f}"
        )


if __name__ == "__main__":
    main()
