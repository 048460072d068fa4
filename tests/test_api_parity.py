"""The Python API takes what the CLI takes: pacing, dry runs, control runs, gates."""

from __future__ import annotations

import inspect
import json
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
from langchain_core.documents import Document
from openai_server import FakeOpenAI, Faults
from support import LIMIT, RATE, ROWS, WINDOW, build_store, docs, run_cli

import ragexam
from ragexam.cli import app as cli
from ragexam.errors import GateFailed
from ragexam.options import COMMANDS, Spec

PRICE_INPUT, PRICE_OUTPUT = 100.0, 400.0


def cli_options(command: str) -> dict[str, Any]:
    """The options `ragexam COMMAND` shows, as typer parsed them, by name."""
    group = typer.main.get_command(cli.app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    return {param.name: param for param in params if not param.hidden and param.name != "help"}


def plain(value: Any) -> Any:
    """A default as both sides state it: an enum by its value, a path as text."""
    return (
        value.value if isinstance(value, Enum) else str(value) if isinstance(value, Path) else value
    )


@pytest.mark.parametrize("spec", COMMANDS, ids=lambda spec: spec.name)
def test_every_cli_option_is_the_api_option_of_that_name_type_and_default(spec: Spec) -> None:
    api = inspect.signature(getattr(ragexam, spec.name)).parameters
    shown = cli_options(spec.name)
    assert set(shown) == set(api) - {"session"}
    for name, param in shown.items():
        taken = api[name].annotation
        given = param.type_descriptor.annotation  # the CLI's type, None stripped
        members = typing.get_args(taken) or (taken,)
        assert taken is Any or given in members, (name, given, taken)
        if param.required:  # no default on either side: the command needs it
            assert api[name].default is inspect.Parameter.empty, name
        else:
            assert plain(param.default) == plain(api[name].default), name


def test_run_takes_every_option_of_the_stages_it_runs() -> None:
    stages = set().union(*(cli_options(name) for name in ("generate", "answer", "judge", "stats")))
    assert stages - {"answers"} <= set(cli_options("run"))


def test_ragexam_help_lists_run_first() -> None:
    assert next(iter(typer.main.get_command(cli.app).commands)) == "run"  # type: ignore[attr-defined]


@pytest.mark.slow
def test_rpm_paces_the_api_under_a_real_rate_limit(env: FakeOpenAI, tmp_path: Path) -> None:
    store = build_store(tmp_path / "store", docs(ROWS))
    env.latency = 1.0  # 15 calls in flight fill the limit exactly
    # The limit of test_rate_limits, over a window twice as long (as its --rpm test does).
    env.faults = Faults(rpm_limit=LIMIT * 2, rpm_window=WINDOW * 2)
    exam = ragexam.generate(store, concurrency=64, rpm=int(RATE * 60))
    assert exam.figures["rows_ok"] == ROWS
    chats = [request for request in env.requests if request.path.endswith("/chat/completions")]
    limited = sum(request.fault == "rpm_limit" for request in chats)
    # The bound of the CLI's --rpm test, on the same rows and limit; unpaced, 64 calls go out
    # at once and the limit turns most of them away (52 of 252 calls over 200 rows, measured).
    assert limited <= 0.02 * len(chats), limited


def test_dry_runs_call_nothing_and_count_what_the_cli_counts(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = build_store(tmp_path / "store", docs(12))
    exam = ragexam.generate(store, limit=5, dry_run=True)
    assert exam.paths == {} and exam.figures["calls"] == 5
    whole = ragexam.run(
        store, samples=2, control_runs=True, controls=3, embedding="openai:e", dry_run=True
    )
    assert env.count() == 0 and env.count("/embeddings") == 0
    assert not (tmp_path / "outputs" / "qa_dataset.csv").exists()
    calls = {e["stage"]: e["calls"] for e in whole.figures["estimates"]}
    # 12 questions, answered and graded twice, in the run and each control run;
    # 3 questions x (4 known answers + 4 injections) x 2 samples for the judge's controls.
    assert calls == {
        "generate": 12,
        "answer": 12,
        "judge": 24,
        "judge_controls": 48,
        "answer_gold": 12,
        "judge_gold": 24,
        "answer_closed_book": 12,
        "judge_closed_book": 24,
    }
    args = ("run", "--chroma", str(store), "--embedding", "openai:e", "--samples", "2")
    dry = run_cli(*args, "--control-runs", *JUDGE_3)
    assert dry.exit_code == 0, dry.output
    assert f"total: {sum(calls.values())} calls" in dry.output
    assert env.count() == 0


JUDGE_3 = ("--controls", "3", "--dry-run")


def test_run_with_control_runs_records_the_whole_cost_and_gates(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXAM_PRICE_INPUT", str(PRICE_INPUT))
    monkeypatch.setenv("RAGEXAM_PRICE_OUTPUT", str(PRICE_OUTPUT))
    env.embedding_dim = 16
    store = build_store(tmp_path / "store", [Document(d.page_content, id=d.id) for d in docs(6)])
    with pytest.raises(GateFailed):  # no answer can be complete to 1.01
        ragexam.run(
            store, embedding="openai:embedder", control_runs=True, fail_under="completeness=1.01"
        )
    assert (tmp_path / "outputs" / "gold" / "judgments.csv").is_file()
    assert (tmp_path / "outputs" / "closed_book" / "judgments.csv").is_file()
    usages = [request.usage for request in env.requests if request.usage is not None]
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    completion = sum(usage["completion_tokens"] for usage in usages)
    expected = (prompt * PRICE_INPUT + completion * PRICE_OUTPUT) / 1e6
    recorded = json.loads((tmp_path / "outputs" / "manifest.json").read_text())
    assert recorded["cost_usd"] == pytest.approx(expected)
