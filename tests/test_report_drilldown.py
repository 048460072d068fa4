"""The report explains every question, filters without script, opens fast, and fits a phone."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from support import HOSTILE, demo_run, open_page, run_cli, write_csv

DOCS = ("guide/alpha.md", "guide/beta.md", "guide/gamma.md")


def drill_run(folder: Path, n: int) -> dict[str, dict[str, Any]]:
    """n questions over three documents: every 3rd missed, every 4th graded low; hand-known."""
    truth: dict[str, dict[str, Any]] = {}
    qa, answers, judgments = [], [], []
    for i in range(n):
        qa_id, chunk = f"q{i:05d}", f"chunk-{i:05d}"
        missed = i % 3 == 0
        rank = "" if missed else 1 + i % 4
        low = i % 4 == 0
        retrieved = [f"other-{i}-{j}" for j in range(4)]
        if not missed:
            retrieved[int(rank) - 1] = chunk
        source = f"Source text of chunk {i}: " + "lorem ipsum dolor " * 40
        question = HOSTILE if i == 1 else f"What is rule {i}?"
        qa.append([qa_id, chunk, DOCS[i % 3], question, f"Rule {i} is {i}.", "ok", ""])
        answers.append([qa_id, f"Answer {i}", json.dumps(retrieved), rank, source, "ok", ""])
        grade = 0.3 if low else 0.9
        judgments.append([qa_id, grade, 0.8, f"Reasoning for {i}.", "ok", ""])
        truth[qa_id] = {"missed": missed, "low": low, "rank": rank, "chunk": chunk}
    folder.mkdir()
    tail = ["status", "error"]
    write_csv(
        folder / "qa_dataset.csv",
        ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", *tail],
        qa,
    )
    write_csv(
        folder / "answers.csv",
        ["qa_id", "answer", "retrieved_ids", "target_rank", "source_text", *tail],
        answers,
    )
    write_csv(
        folder / "judgments.csv",
        ["qa_id", "completeness", "conciseness", "reasoning", *tail],
        judgments,
    )
    return truth


def test_every_question_is_in_the_report_with_what_explains_it(tmp_path: Path) -> None:
    truth = drill_run(tmp_path / "run", 60)
    assert run_cli("stats", "--out", str(tmp_path / "run")).exit_code == 0
    html = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    blocks = re.findall(r'<div class="(q[^"]*)" id="q-(q\d+)">(.*?)</dl></div>', html)
    assert {qa_id for _, qa_id, _ in blocks} == set(truth)
    for classes, qa_id, body in blocks:
        known = truth[qa_id]
        assert ("miss" in classes.split()) == known["missed"]
        assert ("lc" in classes.split()) == known["low"]
        assert f"Reasoning for {int(qa_id[1:])}." in body and f"Rule {int(qa_id[1:])} is" in body
        if known["missed"]:
            assert "← source" not in body
        else:  # the source chunk's id is the marked one
            assert f'<li class="src">{known["chunk"]} ← source</li>' in body
        assert f"Source text of chunk {int(qa_id[1:])}:" in body
    assert html.count('<details class="dg') == 3
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html


def test_past_its_limit_the_drill_down_holds_the_lowest_graded_of_every_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ragexam.report.drilldown.SHOWN_QUESTIONS", 7)
    truth = drill_run(tmp_path / "run", 60)
    assert run_cli("stats", "--out", str(tmp_path / "run")).exit_code == 0
    html = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    shown = set(re.findall(r'<div class="q[^"]*" id="q-(q\d+)">', html))
    # Graded low: i % 4 == 0; document i % 3. Two from each document (7 // 3), the earliest
    # low ones (a stable sort): 0, 12 | 4, 16 | 8, 20; then the lowest left, 24.
    assert shown == {f"q{i:05d}" for i in (0, 12, 4, 16, 8, 20, 24)}
    assert all(truth[qa_id]["low"] for qa_id in shown)
    assert "The 7 lowest-graded questions of 60" in html
    assert html.count("lowest graded of 20 questions") == 3  # each document has 20
    assert "judgments.csv and answers.csv hold all" in html


@pytest.mark.slow
def test_filters_work_without_script(tmp_path: Path, browser: Any) -> None:
    truth = drill_run(tmp_path / "run", 60)
    assert run_cli("stats", "--out", str(tmp_path / "run")).exit_code == 0
    page = open_page(browser, 1280, 900)
    page.goto((tmp_path / "run" / "report.html").as_uri())
    visible = (
        "() => [...document.querySelectorAll('.q')].filter(q => q.checkVisibility()).map(q => q.id)"
    )
    assert page.evaluate(visible) == []  # every document starts closed
    page.evaluate("() => document.querySelectorAll('details.dg').forEach(d => d.open = true)")
    assert len(page.evaluate(visible)) == 60
    page.click("label[for=fq-miss]")
    missed = {f"q-{qa_id}" for qa_id, known in truth.items() if known["missed"]}
    assert set(page.evaluate(visible)) == missed
    page.click("label[for=fq-lc]")  # both: missed and low completeness
    both = {f"q-{qa_id}" for qa_id, k in truth.items() if k["missed"] and k["low"]}
    assert set(page.evaluate(visible)) == both and both
    page.click("label[for=fq-miss]")
    page.click("label[for=fq-lc]")
    assert len(page.evaluate(visible)) == 60
    diagnosis = page.evaluate("() => document.querySelector('details.dg').className.split(' ')[1]")
    page.click(f"label[for=fd-{diagnosis.removeprefix('d-')}]")
    shown = page.evaluate(
        "() => [...document.querySelectorAll('details.dg')].filter(d => d.checkVisibility()).length"
    )
    same = page.evaluate(f"() => document.querySelectorAll('details.{diagnosis}').length")
    assert shown == same >= 1
    dots = page.evaluate(
        "() => [...document.querySelectorAll('svg circle title')].map(t => t.textContent)"
    )
    assert any(doc in dot for dot in dots for doc in DOCS)  # the scatter's dots say which they are


@pytest.mark.slow
def test_a_5000_question_report_opens_in_under_2_seconds(tmp_path: Path, browser: Any) -> None:
    drill_run(tmp_path / "run", 5000)
    assert run_cli("stats", "--out", str(tmp_path / "run")).exit_code == 0
    report = tmp_path / "run" / "report.html"
    page = open_page(browser, 1280, 900)
    started = time.monotonic()
    page.goto(report.as_uri(), wait_until="load")
    seconds = time.monotonic() - started
    loaded = page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd")
    print(f"5000 questions: {report.stat().st_size / 1e6:.1f} MB, load event {loaded:.0f} ms")
    assert page.evaluate("() => document.querySelectorAll('.q').length") == 5000
    assert loaded < 2000 and seconds < 4


@pytest.mark.slow
def test_a_phone_gets_no_horizontal_overflow_and_readable_charts(
    tmp_path: Path, browser: Any
) -> None:
    run = demo_run(tmp_path / "run")
    assert run_cli("stats", "--out", str(run)).exit_code == 0
    page = open_page(browser, 390, 844)
    page.goto((run / "report.html").as_uri())
    page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    cards = page.evaluate(
        "() => [...document.querySelectorAll('.card')].map(c => c.getBoundingClientRect().right)"
    )
    assert len(cards) == 5 and max(cards) <= 390
    sizes = page.evaluate(  # of the charts shown: a phone's are drawn narrow, the wide hidden
        "() => [...document.querySelectorAll('svg text')].filter(t => t.getScreenCTM()).map(t =>"
        " parseFloat(getComputedStyle(t).fontSize)"
        " * Math.hypot(t.getScreenCTM().a, t.getScreenCTM().b))"
    )
    assert sizes and min(sizes) >= 10, min(sizes)
    charts = page.evaluate(
        "() => [...document.querySelectorAll('.pair > div')]"
        ".map(d => d.getBoundingClientRect().top)"
    )
    assert len(charts) == 2 and charts[0] != charts[1]  # stacked, not side by side
