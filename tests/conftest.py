"""The suite's fixtures: the fake OpenAI server, a clean environment, a Chroma server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Tests send nothing off this machine: Haystack and Chroma report usage unless told not to.
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"
os.environ["ANONYMIZED_TELEMETRY"] = "False"

from openai_server import FakeOpenAI
from support import CHROMIUM, FLAGS, SERVERS, build_store, docs, free_port

# -- fake OpenAI server ---------------------------------------------------------------------------
# A fresh server per test: it costs about a millisecond and no knob or request log can leak.


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI (defaults: no latency, no faults, no API key check)."""
    with FakeOpenAI() as server:
        yield server


# -- other fixtures -------------------------------------------------------------------------------


def _signal_state() -> tuple[Any, ...]:
    """Ctrl-C's, SIGTERM's and SIGHUP's handlers, and the signals blocked or pending in this
    thread."""
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = tuple(signal.getsignal(number) for number in numbers)
    return *handlers, signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.sigpending()


@pytest.fixture(autouse=True)
def signals_left_as_found() -> Iterator[None]:
    """A test leaves the process's signals as it found them: a later test that interrupts a
    run in this process would otherwise not stop it, or wait for ever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = _signal_state()
    yield
    assert _signal_state() == before, "this test left the process's signals changed"


@pytest.fixture
def env(fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeOpenAI:
    """Point ragexam at the fake server, in an empty working directory with no stray settings."""
    for name in list(os.environ):
        if name.startswith(("RAGEXAM_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no developer's .env is read
    monkeypatch.setenv("OPENAI_BASE_URL", fake_llm.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key")
    monkeypatch.setenv("RAGEXAM_RETRY_BACKOFF", "0.01")
    monkeypatch.setenv("RAGEXAM_TIMEOUT", "10")
    return fake_llm


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Debian Chromium with a fresh profile."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium); CI installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path / "profile", executable_path=CHROMIUM, args=FLAGS
        )
        yield context
        context.close()


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[str]:
    """`chroma run` serving a store of 30 chunks; yields its URL."""
    store = build_store(tmp_path / "served", docs(30))
    port = free_port()
    chroma = Path(sys.executable).with_name("chroma")
    if not chroma.exists():
        chroma = Path(shutil.which("chroma") or "chroma")
    server = subprocess.Popen(
        [str(chroma), "run", "--path", str(store), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    SERVERS[url] = server
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1).read()
                break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        SERVERS.pop(url, None)
        server.terminate()
        server.wait(timeout=10)
