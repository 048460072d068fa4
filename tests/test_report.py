"""The HTML report: self-contained, every text escaped, and it renders in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from support import CHROMIUM, FLAGS, HOSTILE, HOSTILE_IMAGE, demo_run, run_cli


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


@pytest.mark.slow
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
