"""The marked script in a world whose right answers are known: where each missed key point was
lost (generation or retrieval) per row and per document beside the control runs, the report's
ticks and crosses, key-point recall, and two runs compared key point by key point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai_server import FakeOpenAI
from support import read_csv, run_cli
from world import World

# found.md is retrieved and answered in full; missed.md is never retrieved; forgetful.md is
# retrieved, but its answers state only the first of three facts.
WORLD = {"found.md": 4, "missed.md": 3, "forgetful.md": 3}


def run_world(env: FakeOpenAI, tmp_path: Path, world: World, out: str, *extra: str) -> Path:
    """`ragexam run` over the world's store, graded by key points against the context."""
    env.responder, env.embed = world.respond, world.embed
    store = world.build_store(tmp_path / f"store-{out}")
    result = run_cli(
        "run", "--chroma", str(store), "--out", out, "--embedding", "openai:fake-embed",
        "--k", "3", "--with-context", *extra,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp_path / out


def by_document(run: Path) -> dict[str, dict[str, str]]:
    rows = read_csv(run / "summary_by_document.csv") + read_csv(run / "summary.csv")
    return {row["document"]: row for row in rows}


def test_each_missed_key_point_is_lost_in_generation_or_in_retrieval_beside_the_control_runs(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World(WORLD, missed={"missed.md"}, forgetful={"forgetful.md"})
    run = run_world(env, tmp_path, world, "run", "--control-runs")
    rows = read_csv(run / "judgments.csv")
    exam = {row["qa_id"]: row["document"] for row in read_csv(run / "qa_dataset.csv")}
    expected = {  # per row: verdicts, whether the chunks held each point, and the losses
        "found.md": (["present"] * 3, [True] * 3, 0.0, 0.0),
        "missed.md": (["absent"] * 3, [False] * 3, 0.0, 3.0),
        "forgetful.md": (["present", "absent", "absent"], [True] * 3, 2.0, 0.0),
    }
    for row in rows:
        verdicts, held, generation, retrieval = expected[exam[row["qa_id"]]]
        assert json.loads(row["key_point_verdicts"]) == verdicts
        assert json.loads(row["key_point_context"]) == held
        assert float(row["lost_in_generation"]) == generation
        assert float(row["lost_in_retrieval"]) == retrieval
        assert row["with_context"] == "true"
    # the control runs are graded without the context: theirs is the other reading
    gold = read_csv(run / "gold" / "judgments.csv")
    assert {row["with_context"] for row in gold} == {"false"}
    summary = by_document(run)
    # key points: found 12, missed 9, forgetful 9 -> 30; recall 12 + 3 of 30
    shares = {
        "found.md": (1.0, 0.0, 0.0),
        "missed.md": (0.0, 0.0, 1.0),
        "forgetful.md": (1 / 3, 2 / 3, 0.0),
        "ALL": (15 / 30, 6 / 30, 9 / 30),
    }
    for document, (recall, generation, retrieval) in shares.items():
        row = summary[document]
        assert float(row["key_point_recall"]) == pytest.approx(recall)
        assert float(row["lost_in_generation"]) == pytest.approx(generation)
        assert float(row["lost_in_retrieval"]) == pytest.approx(retrieval)
    assert summary["ALL"]["key_points"] == "30"
    # the control runs read the same: gold completes missed.md, but not forgetful.md
    assert float(summary["missed.md"]["retrieval_loss"]) == pytest.approx(1.0)
    assert float(summary["forgetful.md"]["completeness_gold"]) == pytest.approx(1 / 3)
    assert summary["forgetful.md"]["diagnosis"] == "generation"
    page = (run / "report.html").read_text()
    assert "Graded by key points" in page and "retrieval loss (control runs)" in page
    assert "lost in generation" in page and "lost in retrieval" in page


def test_the_report_reads_like_a_marked_script(env: FakeOpenAI, tmp_path: Path) -> None:
    world = World(WORLD, missed={"missed.md"}, forgetful={"forgetful.md"})
    run = run_world(env, tmp_path, world, "run")
    page = (run / "report.html").read_text()
    # a forgetful answer: its first key point ticked with the answer's words, two crossed
    d = world.names.index("forgetful.md")
    first, second = (f"The record states fact{d}x0{c}." for c in "ab")
    assert (
        f'<li class="present"><b title="present">\u2713</b>{first} <q>fact{d}x0a</q></li>' in page
    )
    assert (
        f'<li class="absent"><b title="missed">\u2717</b>{second} <small>in the retrieved '
        "chunks: lost in generation</small></li>" in page
    )
    assert "Most-missed key points, by document" in page
    assert "forgetful.md <small>· 6 key points missed</small>" in page
    assert "missed.md <small>· 9 key points missed</small>" in page
    stats = run_cli("stats", "--out", "run")
    assert "key points: recall 0.50 of 30; lost in generation 0.20, in retrieval 0.30" in (
        " ".join(stats.output.split())
    )


def test_an_answer_padded_with_facts_the_ground_truth_lacks_shows_them_unsupported(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    world = World({"a.md": 2})
    honest = world.answer
    world.answer = lambda question, context, forgetful=False: (  # type: ignore[method-assign]
        honest(question, context) + " It also states fact9x9q."
    )
    run = run_world(env, tmp_path, world, "run")
    for row in read_csv(run / "judgments.csv"):
        said = json.loads(row["answer_statements"])
        assert said[-1] == {"statement": "fact9x9q", "verdict": "unsupported"}
        assert float(row["conciseness"]) == pytest.approx(3 / 4)
    page = (run / "report.html").read_text()
    assert '<li class="unsupported">fact9x9q <small>unsupported</small></li>' in page


def test_compare_pairs_two_runs_on_one_exam_key_point_by_key_point(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    run_world(env, tmp_path, World(WORLD, missed={"missed.md"}), "a", "--controls", "0")
    # the same exam sat again by a system that forgets: answer and judge only
    world = World(WORLD, missed={"missed.md"}, forgetful={"forgetful.md"})
    env.responder = world.respond
    store = tmp_path / "store-a"
    again = run_cli(
        "run", "--chroma", str(store), "--out", "b", "--qa-dataset", "a/qa_dataset.csv",
        "--embedding", "openai:fake-embed", "--k", "3", "--controls", "0",
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    result = run_cli("compare", "a", "b")
    assert result.exit_code == 0, result.output
    table = {(r["document"], r["metric"]): r for r in read_csv(tmp_path / "b" / "comparison.csv")}
    overall = table[("ALL", "key_points")]
    # 30 key points paired; forgetful.md's 3 answers each lose 2 of their 3
    assert (overall["n"], overall["worse"], overall["improved"]) == ("30", "6", "0")
    assert float(overall["mean_a"]) == pytest.approx(21 / 30)
    assert float(overall["mean_b"]) == pytest.approx(15 / 30)
    assert table[("forgetful.md", "key_points")]["worse"] == "6"
    assert table[("found.md", "key_points")]["same"] == "12"
    changes = read_csv(tmp_path / "b" / "key_point_changes.csv")
    assert len(changes) == 6 and {r["document"] for r in changes} == {"forgetful.md"}
    assert {(r["verdict_a"], r["verdict_b"]) for r in changes} == {("present", "absent")}
    assert "key points: 0 gained, 6 lost in run B" in " ".join(result.output.split())
    assert {r["kind"] for r in table.values() if r["metric"] == "key_points"} == {"all"}
    assert "nan" not in result.output  # the table's kind column, as for every other metric
    # through the API, the Result names both files compare wrote (it named comparison.csv)
    import ragexam

    api = ragexam.compare("a", "b", out="api")
    assert api.paths == {
        "comparison": Path("api/comparison.csv"),
        "key_point_changes": Path("api/key_point_changes.csv"),
    }
    assert len(api.frame("key_point_changes")) == 6


def test_compare_leaves_out_a_key_point_whose_text_differs(env: FakeOpenAI, tmp_path: Path) -> None:
    run_world(env, tmp_path, World({"a.md": 2}), "a", "--controls", "0")
    run_world(env, tmp_path, World({"a.md": 2}), "b", "--controls", "0")
    path = tmp_path / "b" / "qa_dataset.csv"
    rows = read_csv(path)
    points = json.loads(rows[0]["key_points"])
    text = path.read_text()
    path.write_text(text.replace(points[0], points[0].replace("states", "holds"), 1))
    result = run_cli("compare", "a", "b")
    assert result.exit_code == 0, result.output
    assert "key points whose text differs between the runs are left out: 1" in " ".join(
        result.output.split()
    )
    table = {(r["document"], r["metric"]): r for r in read_csv(tmp_path / "b" / "comparison.csv")}
    assert table[("ALL", "key_points")]["n"] == "5"
