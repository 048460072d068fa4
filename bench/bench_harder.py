"""Benchmark what verifying harder questions costs: calls per question kept, and the share kept.

    uv run python bench/bench_harder.py [--multi-hop 10] [--unanswerable 5]

Two stores, each through the test server (no latency: calls are counted, not timed):
- world: the test suite's world of records (tests/world.py), three documents of ten records,
  linked across documents, with every fifth record restating its neighbour's facts, a fact
  invented about every seventh, and every sixth seed asking what the store answers;
- corpus: examples/corpus loaded as the quickstart loads it (examples/load_corpus.py with
  OpenAI-compatible embeddings, here the test server's), written, answered and judged by
  models that copy sentences (tests/extractive.py).
For each kind asked it prints the questions kept of those tried (the share kept), why the rest
were dropped, and the calls and tokens (writing and verification) per question kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import ROOT, FakeOpenAI, World, extractive, run_stage


def linked_world() -> World:
    """Three documents of ten records, a and b linked record by record, with faults planted."""
    records = [(d, i) for d in range(3) for i in range(10)]
    return World(
        {"a.md": 10, "b.md": 10, "c.md": 10},
        partners={(0, i): (1, i) for i in range(10)},
        repeats={(d, i) for d, i in records if i % 5 == 4},
        invents={(d, i) for d, i in records if i % 7 == 3},
        answered={(d, i) for d, i in records if i % 6 == 2},
    )


def world_store(folder: Path, server: FakeOpenAI) -> tuple[Path, list[str]]:
    """The world's store, its models on the server; the options generate needs for it."""
    the_world = linked_world()
    server.responder, server.embed = the_world.respond, the_world.embed
    return the_world.build_store(folder), ["--embedding", "openai:fake-embed"]


def corpus_store(folder: Path, server: FakeOpenAI) -> tuple[Path, list[str]]:
    """examples/corpus loaded as the quickstart does, embedded by the server; extractive models."""
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
    load = [sys.executable, str(ROOT / "examples" / "load_corpus.py"), "--chroma", str(folder)]
    subprocess.run([*load, "--embedding", "openai:fake-embed"], env=env, check=True)
    server.responder, server.embed = extractive.respond, None
    return folder, []  # the store's own embedding function, as the quickstart uses it


STORES: dict[str, Callable[[Path, FakeOpenAI], tuple[Path, list[str]]]] = {
    "world": world_store,
    "corpus": corpus_store,
}


def measure(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Generate with harder questions over one store; the stage's manifest record."""
    with FakeOpenAI() as server:
        store, options = STORES[name](tmp / f"{name}-store", server)
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "bench"}
        command = ["generate", "--chroma", str(store), *options]
        command += ["--multi-hop", str(args.multi_hop), "--unanswerable", str(args.unanswerable)]
        record = run_stage(env, tmp / f"{name}-run", command)
        record["chat_calls"] = server.count()
    return record


def report(name: str, record: dict[str, Any], out: Path) -> None:
    """Per kind: kept of tried, why dropped, calls and tokens per question kept."""
    singles = sum(1 for row in _rows(out / "qa_dataset.csv") if row["kind"] == "single")
    print(f"{name}: {singles} single questions ({singles} calls); {record['chat_calls']} calls")
    rows = _rows(out / "qa_dataset.csv") + _rows(out / "dropped_questions.csv")
    for kind, figures in record["harder"].items():
        mine = [row for row in rows if row["kind"] == kind]
        tokens = sum(
            int(row["prompt_tokens"] or 0) + int(row["completion_tokens"] or 0) for row in mine
        )
        kept, tried = figures["kept"], figures["tried"]
        share = f"{kept / tried:.0%}" if tried else "-"
        print(f"  {kind}: kept {kept} of {tried} tried ({share}); asked {figures['asked']}")
        for reason, count in figures["reasons"].items():
            print(f"    dropped {count}: {reason}")
        if kept:
            print(
                f"    {figures['calls'] / kept:.2f} calls and {tokens / kept:,.0f} tokens per "
                f"question kept ({figures['calls']} calls in all)"
            )


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    if not path.exists():
        return []
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def main() -> None:
    """Both stores, one after the other."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--multi-hop", type=int, default=10)
    parser.add_argument("--unanswerable", type=int, default=5)
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=list(STORES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for name in args.stores:
            record = measure(name, args, tmp)
            report(name, record, tmp / f"{name}-run")
            print(json.dumps(record["harder"]), file=sys.stderr)


if __name__ == "__main__":
    main()
