"""The HTML report: self-contained, every text escaped, and it renders in headless Chromium."""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_stats import write_csv

CHROMIUM = Path("/usr/bin/chromium")
# The flags this machine needs, and none that fetch anything.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = "<script>alert(1)</script>"
HOSTILE_IMAGE = "<img src=x onerror=alert(2)>"
# document -> (chance the source chunk is retrieved, completeness when it is, when it is not,
# conciseness): one profile per diagnosis
PROFILES = {
    "handbook/remote-work-policy.md": (0.4, 0.7, 0.1, 0.8),
    "handbook/expenses-and-travel.md": (0.95, 0.4, 0.2, 0.8),
    "handbook/security/incident-response-runbook.md": (0.9, 0.9, 0.5, 0.3),
    "handbook/onboarding.md": (0.95, 0.95, 0.5, 0.9),
    "handbook/benefits/parental-leave.md": (0.85, 0.85, 0.3, 0.75),
    "handbook/code-of-conduct.md": (0.6, 0.8, 0.2, 0.7),
    HOSTILE: (0.5, 0.3, 0.0, 0.5),
}


def demo_run(folder: Path) -> Path:
    """Seven documents, one per profile, with hostile text in a document, question and answer."""
    rng = random.Random(11)
    qa, answers, judgments = [], [], []
    for number, (document, (hit, good, bad, concise)) in enumerate(PROFILES.items()):
        for index in range(rng.randint(8, 30)):
            qa_id = f"d{number}q{index}"
            question = HOSTILE if document == HOSTILE else f"What does section {index} say?"
            qa.append([qa_id, f"c{qa_id}", document, question, f"{HOSTILE_IMAGE} truth", "ok", ""])
            rank = rng.randint(1, 5) if rng.random() < hit else ""
            answer = f"{HOSTILE} answer" if document == HOSTILE else "It says so."
            answers.append([qa_id, answer, "[]", rank, "ok", ""])
            mean = good if rank else bad
            score = [min(1, max(0, round(rng.gauss(m, 0.15), 1))) for m in (mean, concise)]
            judgments.append([qa_id, *score, "ok", ""])
    folder.mkdir()
    common = ["status", "error"]
    qa_header = ["qa_id", "chunk_id", "document", "question", "ground_truth_answer", *common]
    write_csv(folder / "qa_dataset.csv", qa_header, qa)
    write_csv(
        folder / "answers.csv",
        ["qa_id", "answer", "retrieved_ids", "target_rank", *common],
        answers,
    )
    write_csv(
        folder / "judgments.csv", ["qa_id", "completeness", "conciseness", *common], judgments
    )
    return folder


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """The report of the demo run, written through the CLI."""
    run = demo_run(tmp_path / "run")
    result = run_cli("stats", "--out", str(run))
    assert result.exit_code == 0, result.output
    return run / "report.html"


def test_report_is_self_contained_and_escaped(report: Path) -> None:
    html = report.read_text(encoding="utf-8")
    tags = re.findall(r"<[^>]*>", html)  # escaped text has no "<", so these are real tags
    assert not [tag for tag in tags if re.search(r"\b(src|href|srcset|action)\s*=", tag)]
    assert not re.search(r"https?://", html) and "@import" not in html and "url(" not in html
    assert not [tag for tag in tags if re.match(r"<(script|img|iframe|link|object)\b", tag, re.I)]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html
    for section in ("Documents, worst completeness first", "Where the source chunk ranked"):
        assert section in html
    assert "Completeness against conciseness" in html and "worst questions" in html
    assert "Completeness below 0.6 is low, hit rate below 0.7 is low" in html


def test_report_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI installs it")
    from playwright.sync_api import sync_playwright

    console, dialogs, errors, requests = [], [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            tmp_path / "profile",  # a fresh user-data-dir
            executable_path=CHROMIUM,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        page = browser.new_page()
        page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("request", lambda request: requests.append(request.url))
        page.goto(report.as_uri())
        text = page.inner_text("body")
        screenshot = tmp_path / "report.png"
        page.screenshot(path=screenshot, full_page=True)
        browser.close()
    assert not [line for line in console if line.startswith(("error", "warning"))], console
    assert not dialogs and not errors
    assert requests == [report.as_uri()]
    assert HOSTILE in text and HOSTILE_IMAGE in text  # shown as text, never run
    assert screenshot.stat().st_size > 10_000
    shutil.copy(screenshot, Path("/tmp/report.png"))  # for a person to look at
