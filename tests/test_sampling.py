"""Stratified sampling and splits: allocations worked out by hand, and through `generate`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from langchain_core.documents import Document
from openai_server import FakeOpenAI
from support import build_store, read_csv, run_cli

from ragexam.analysis.sampling import Sampling, allocate, assign_splits
from ragexam.errors import ConfigError


@pytest.mark.parametrize(
    ("counts", "n", "expected"),
    [
        ({f"d{i}": 20 for i in range(6)}, 30, {f"d{i}": 5 for i in range(6)}),
        # quotas 6, 3, 1: exact
        ({"a": 60, "b": 30, "c": 10}, 10, {"a": 6, "b": 3, "c": 1}),
        # quotas 3, 1.5, 0.5: floors 3, 1, 0; c is raised to its one, which uses up the five
        ({"a": 60, "b": 30, "c": 10}, 5, {"a": 3, "b": 1, "c": 1}),
        # quotas 1.2, 0.6, 0.2 and fewer than one each: b has the largest remainder
        ({"a": 60, "b": 30, "c": 10}, 2, {"a": 1, "b": 1, "c": 0}),
        # quotas 2.94, 0.03, 0.03: each small one gets its one, taken from a
        ({"a": 100, "b": 1, "c": 1}, 3, {"a": 1, "b": 1, "c": 1}),
        # quotas 1.5 and 1.5: a tie, broken by name
        ({"a": 2, "b": 2}, 3, {"a": 2, "b": 1}),
        # more than there is: everything
        ({"a": 2, "b": 3}, 9, {"a": 2, "b": 3}),
    ],
)
def test_allocation_is_proportional_with_at_least_one_each(
    counts: dict[str, int], n: int, expected: dict[str, int]
) -> None:
    assert allocate(counts, n) == expected


def test_splits_per_document_are_as_equal_as_the_counts_allow() -> None:
    chunks = [
        (f"{doc}{i}", doc) for doc, size in (("a", 5), ("b", 4), ("c", 1)) for i in range(size)
    ]
    splits = assign_splits(chunks, 0.5, seed=1)
    counts = Counter((doc, splits[chunk_id]) for chunk_id, doc in chunks)
    # 0.5 x 5 = 2.5 rounds up to 3; 0.5 x 4 = 2; 0.5 x 1 = 0.5 rounds up to 1.
    assert counts == {("a", "validation"): 3, ("a", "test"): 2, ("b", "validation"): 2,
                      ("b", "test"): 2, ("c", "validation"): 1}  # fmt: skip
    assert assign_splits(chunks, 0.5, seed=1) == splits


def test_bad_choices_are_refused() -> None:
    with pytest.raises(ConfigError, match="not both"):
        Sampling(sample=3, per_document=1)
    with pytest.raises(ConfigError, match="between 0 and 1"):
        Sampling(split=1.5)


def corpus(path: Path) -> Path:
    """Six documents of twenty chunks each."""
    docs = [
        Document(page_content=f"Section {i} of manual {d}: setting {d}-{i} is {i * d}.",
                 metadata={"source": f"manual{d}.md"})
        for d in range(6) for i in range(20)
    ]  # fmt: skip
    return build_store(path, docs)


def chosen(run: Path) -> list[tuple[str, str, str]]:
    """(chunk_id, document, split) of every row, sorted."""
    return sorted(
        (r["chunk_id"], r["document"], r["split"]) for r in read_csv(run / "qa_dataset.csv")
    )


def test_sample_thirty_of_six_documents_gives_five_each_reproducibly(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = str(corpus(tmp_path / "store"))
    args = ("generate", "--chroma", store, "--sample", "30", "--seed", "4", "--validation", "0.5")
    first = run_cli(*args, "--out", "one")
    assert first.exit_code == 0, first.output
    rows = chosen(tmp_path / "one")
    assert len(rows) == 30 and env.count() == 30
    assert Counter(doc for _, doc, _ in rows) == {f"manual{d}.md": 5 for d in range(6)}
    for d in range(6):
        splits = Counter(split for _, doc, split in rows if doc == f"manual{d}.md")
        assert set(splits) == {"validation", "test"}
        assert abs(splits["validation"] - splits["test"]) <= 1
    assert run_cli(*args, "--out", "two").exit_code == 0
    assert chosen(tmp_path / "two") == rows
    other = run_cli(*args[:-4], "--seed", "5", "--out", "three")
    assert other.exit_code == 0
    assert {c for c, _, _ in chosen(tmp_path / "three")} != {c for c, _, _ in rows}
    manifest = (tmp_path / "one" / "manifest.json").read_text()
    assert '"sample": 30' in manifest and '"split": 0.5' in manifest


def test_another_sample_into_the_same_file_is_refused(env: FakeOpenAI, tmp_path: Path) -> None:
    store = str(corpus(tmp_path / "store"))
    per_document = run_cli("generate", "--chroma", store, "--per-document", "2", "--out", "run")
    assert per_document.exit_code == 0, per_document.output
    rows = chosen(tmp_path / "run")
    assert Counter(doc for _, doc, _ in rows) == {f"manual{d}.md": 2 for d in range(6)}
    calls = env.count()
    again = run_cli("generate", "--chroma", store, "--per-document", "2", "--out", "run")
    assert again.exit_code == 0 and env.count() == calls  # the same choice resumes: nothing to do
    refused = run_cli("generate", "--chroma", store, "--sample", "30", "--out", "run")
    assert refused.exit_code == 2 and "per_document=2" in refused.output
    assert "sample=30" in refused.output and env.count() == calls
    everything = run_cli("generate", "--chroma", store, "--out", "run")
    assert everything.exit_code == 2 and "every chunk" in everything.output
    assert chosen(tmp_path / "run") == rows
