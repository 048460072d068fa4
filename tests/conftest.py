"""Shared pytest fixtures for the ragexam test suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai_server import FakeOpenAI

# -- fake OpenAI server ---------------------------------------------------------------------------
# A fresh server per test: it costs about a millisecond and no knob or request log can leak.


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI (defaults: no latency, no faults, no API key check)."""
    with FakeOpenAI() as server:
        yield server


# -- other fixtures -------------------------------------------------------------------------------
