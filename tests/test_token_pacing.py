"""--tpm paces calls under a server's limit on tokens, on the real clock (test_pacing.py shows,
on virtual time, that without it the limit is hit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai_server import FakeOpenAI, Faults
from support import build_store, docs, gpt_like_tokens, read_csv, run_cli

# The server's token limit, scaled down in time as in test_rate_limits.py: TOKENS prompt
# tokens per WINDOW seconds is TOKENS * 60 / WINDOW a minute. Claims are ratios to it.
TOKENS, WINDOW = 12500, 4.0
ROWS = 160


def prompt_tokens(body: dict[str, Any]) -> int:
    """A chat call's prompt tokens, by the rule the server bills and limits by."""
    return gpt_like_tokens("\n".join(str(message["content"]) for message in body["messages"]))


def token_limited_run(
    env: FakeOpenAI, tmp_path: Path, *extra: str
) -> tuple[list[dict[str, str]], float, float]:
    """Generate ROWS rows under the token limit: rows, share of the limit used, share of 429s."""
    store = build_store(tmp_path / "store", docs(ROWS))
    env.latency = 0.5
    env.count_tokens = gpt_like_tokens
    env.faults = Faults(tpm_limit=TOKENS, tpm_window=WINDOW)
    args = ("generate", "--chroma", str(store), "--out", "run", "--concurrency", "64", *extra)
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    chats = [request for request in env.requests if request.path.endswith("/chat/completions")]
    admitted = [request for request in chats if request.fault != "tpm_limit"]
    tokens = sum(prompt_tokens(request.body) for request in admitted)
    seconds = chats[-1].at - chats[0].at + env.latency
    limited = (len(chats) - len(admitted)) / len(chats)
    return rows, tokens / seconds / (TOKENS / WINDOW), limited


@pytest.mark.slow
def test_tpm_paces_calls_under_a_token_limit(env: FakeOpenAI, tmp_path: Path) -> None:
    tpm = str(round(TOKENS * 60 / WINDOW))
    rows, share, limited = token_limited_run(env, tmp_path, "--tpm", tpm)
    assert len(rows) == ROWS and {row["status"] for row in rows} == {"ok"}
    assert limited <= 0.02, limited
    # Paced at 95% of the limit, by an estimate of tokens that runs ~10% above the server's
    # count (on purpose: erring high is what keeps 429s away), so ~0.86 at best.
    assert share >= 0.7, share
