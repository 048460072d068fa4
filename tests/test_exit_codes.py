"""Exit codes a CI job can act on: gates (3), a dead endpoint (4), SIGTERM (130)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAI
from support import BASE, build_store, closed_port, docs, read_csv, run_cli, write_run

from ragexam.cli.app import interruptible
from ragexam.stages import stopping

# The crafted runs of test_compare: completeness (i % 3) * 0.25, so its mean is 0.25; of the
# 24 questions only the 4 with three-character ids have their chunk at rank 1: hit rate 1/6.


def test_stats_passes_a_gate_it_meets(tmp_path: Path) -> None:
    write_run(tmp_path / "a", BASE)
    result = run_cli("stats", "--out", str(tmp_path / "a"), "--fail-under", "completeness=0.25")
    assert result.exit_code == 0, result.output


def test_stats_exits_3_naming_the_figure_below_its_bound(tmp_path: Path) -> None:
    write_run(tmp_path / "a", BASE)
    gates = "completeness=0.3,hit_rate=0.16,mrr=0.2"
    result = run_cli("stats", "--out", str(tmp_path / "a"), "--fail-under", gates)
    assert result.exit_code == 3, result.output
    assert "completeness 0.250 < 0.3" in result.output and "mrr 0.167 < 0.2" in result.output
    assert "hit_rate" not in result.output.split("quality gate failed")[1]
    assert (tmp_path / "a" / "summary.csv").exists()  # the summary is written all the same


# "nan" and "inf" were accepted: bounds nothing fails (nan) or everything fails (inf)
@pytest.mark.parametrize(
    "gates", ["completeness", "completeness=high", "loudness=0.5", "completeness=nan", "mrr=inf"]
)
def test_a_malformed_gate_is_a_usage_error(tmp_path: Path, gates: str) -> None:
    write_run(tmp_path / "a", BASE)
    result = run_cli("stats", "--out", str(tmp_path / "a"), "--fail-under", gates)
    assert result.exit_code == 2, result.output
    assert "--fail-under" in result.output


def test_compare_fails_on_a_sure_regression_only(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", BASE)
    worse = write_run(tmp_path / "worse", {qa_id: score / 2 for qa_id, score in BASE.items()})
    better = write_run(tmp_path / "better", {qa_id: score + 0.25 for qa_id, score in BASE.items()})
    assert run_cli("compare", str(a), str(worse)).exit_code == 0  # no gate asked for
    failed = run_cli("compare", str(a), str(worse), "--fail-on-regression")
    assert failed.exit_code == 3, failed.output
    assert "regression from run A to run B: completeness -0.125" in failed.output
    assert run_cli("compare", str(a), str(better), "--fail-on-regression").exit_code == 0


def test_an_unreachable_endpoint_stops_the_stage_with_exit_4(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build_store(tmp_path / "store", docs(300))
    url = f"http://127.0.0.1:{closed_port()}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 4, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and url in lines[0] and "first 20 calls" in lines[0]
    assert "connect" in lines[0].lower()
    output = tmp_path / "run" / "qa_dataset.csv"
    assert len(read_csv(output) if output.exists() else []) < 20  # not 300 error rows


def three_rows_against(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """`generate` of 3 chunks against this base URL, one retry a call: it stops with exit 4
    (fewer calls than the first-calls cut-off: said at the end); what it said."""
    store = build_store(tmp_path / "store", docs(3))
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("RAGEXAM_MAX_RETRIES", "1")
    result = run_cli("generate", "--chroma", str(store), "--out", "run", "--limit", "3")
    assert result.exit_code == 4, result.output
    return str(result.output)


def test_a_base_url_without_v1_is_said_to_answer_404_not_to_be_down(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server is up: blaming the connection sends the user to check the wrong thing.
    url = env.base_url.removesuffix("/v1")
    output = three_rows_against(url, tmp_path, monkeypatch)
    (line,) = [line for line in output.splitlines() if line.startswith("Error:")]
    assert "it answered HTTP 404" in line and "cannot connect" not in line
    assert f"OPENAI_BASE_URL={url}/v1?" in " ".join(output.split())


def test_https_on_a_port_that_speaks_http_is_named(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = env.base_url.replace("http://", "https://")
    said = " ".join(three_rows_against(url, tmp_path, monkeypatch).split())
    assert "it speaks no TLS there: use http://" in said and "not permitted" not in said


def test_an_unreachable_endpoint_stops_a_small_stage_with_exit_4_too(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 3 chunks make fewer calls than the first-calls cut-off: it is said at the end, not
    # as "3 of 3 rows ended in error" (exit 1), which blames the rows
    url = f"http://127.0.0.1:{closed_port()}/v1"
    output = three_rows_against(url, tmp_path, monkeypatch)
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and url in lines[0] and "failed every call of the stage" in lines[0]
    assert "connect" in lines[0].lower() and "ended in error" not in output


def ignore_sigint() -> None:
    """What a non-interactive shell does to a job it starts with `&`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def generating(
    env: FakeOpenAI, tmp_path: Path, lines: int, **popen: Any
) -> tuple[subprocess.Popen[str], Path, list[str]]:
    """`ragexam generate` over 120 slow chunks in a child process, once its output holds
    `lines` lines (or a minute has gone): the child, its output file, and its arguments."""
    store = build_store(tmp_path / "store", docs(120))
    env.latency = 0.1
    args = ["generate", "--chroma", str(store), "--out", "run", "--concurrency", "4"]
    process = subprocess.Popen(
        [sys.executable, "-m", "ragexam.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    output = tmp_path / "run" / "qa_dataset.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _lines(output) < lines:
        time.sleep(0.02)
    return process, output, args


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sent", "again"), [(signal.SIGTERM, 0), (signal.SIGTERM, 20), (signal.SIGHUP, 20)]
)
def test_sigterm_is_an_interrupt_that_keeps_every_finished_row(
    env: FakeOpenAI, tmp_path: Path, sent: signal.Signals, again: int
) -> None:
    # `again`: a supervisor, or a user, sends TERM more than once: those after the first
    # wait for it to wind the stage down (they ended the process as it exited: 143).
    # SIGHUP: the terminal went away (an ssh session dropped): it ended the process (129),
    # its manifest left "running".
    process, output, args = generating(env, tmp_path, 21)
    os.kill(process.pid, sent)
    for _ in range(again):
        time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sent)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Interrupted" in stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["status"] == "interrupted"
    kept = read_csv(output)
    assert 20 <= len(kept) < 120 and {row["status"] for row in kept} == {"ok"}
    calls = env.count()
    env.latency = 0.0
    assert run_cli(*args).exit_code == 0
    assert env.count() - calls == 120 - len(kept)  # the kept rows are not asked again


@contextlib.contextmanager
def sigterm_interrupts() -> Any:
    """ragexam's SIGTERM handler in this process, for the test (and Ctrl-C's, which it sets
    when the process ignores it: a test run started with `&`)."""
    numbers = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    before = [signal.getsignal(number) for number in numbers]
    interruptible()
    try:
        assert signal.getsignal(signal.SIGTERM) is not before[0]
        yield
    finally:
        for number, handler in zip(numbers, before, strict=True):
            signal.signal(number, handler)


def test_sigterm_cancels_a_running_stage_instead_of_raising_into_its_code() -> None:
    # Raised into the event loop, the interrupt landed wherever the loop was (a lock's
    # release, a connection pool's bookkeeping) and a SIGTERM'd run hung there (CI saw it):
    # the stage's code now runs on to its next await, where the stage is cancelled.
    seen: list[str] = []

    async def stage() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at once, in this thread
        seen.append("ran on to its await")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def next_one() -> int:
        return 7

    with sigterm_interrupts():
        with pytest.raises(KeyboardInterrupt):
            stopping.run(stage())
        assert seen == ["ran on to its await", "cancelled"]
        assert stopping.run(next_one()) == 7  # said once: a later command in the process runs
    with sigterm_interrupts(), pytest.raises(KeyboardInterrupt):  # between stages: at once
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


def test_sigterm_past_a_stages_last_await_stops_the_command_as_the_stage_ends() -> None:
    # the cancel lands on a task that has nothing left to await: the stage is whole, and
    # the command stops there (it went on to its next stage, or exited 0 after the last)
    async def stage() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        return 7

    async def next_one() -> int:
        return 8

    with sigterm_interrupts():
        with pytest.raises(KeyboardInterrupt):
            stopping.run(stage())
        assert stopping.run(next_one()) == 8  # said once


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGINT])
def test_a_run_a_script_started_in_the_background_ends_on_kill_and_on_ctrl_c(
    env: FakeOpenAI, tmp_path: Path, sent: signal.Signals
) -> None:
    # A non-interactive shell starts `ragexam ... &` with SIGINT ignored; so does this.
    process, output, args = generating(env, tmp_path, 11, preexec_fn=ignore_sigint)
    os.kill(process.pid, sent)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    kept = read_csv(output)
    assert 10 <= len(kept) < 120 and {row["status"] for row in kept} == {"ok"}
    calls = env.count()
    env.latency = 0.0
    assert run_cli(*args).exit_code == 0
    assert env.count() - calls == 120 - len(kept)  # every finished row was kept


def test_a_stopped_stage_still_says_what_it_noted(
    env: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragexam.stages.runner import Runner

    store = build_store(tmp_path / "store", docs(12))
    real = Runner.settle

    def ctrl_c_after_one(self: Runner, *args: Any) -> None:
        real(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "settle", ctrl_c_after_one)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 130
    said = result.output.splitlines()
    assert said[-1].startswith("Interrupted: every finished row is saved")
    assert any(line.startswith("reading a snapshot of") for line in said[:-1])  # not lost
