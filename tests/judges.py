"""Judges for the test server: each grades from the texts the judge prompt delimits, or does not.

Set one as `FakeOpenAI.responder`. A request that is not a judge's (no <ground_truth> in it)
gets the server's default reply. Grades come back in the form and scale the request asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from openai_server import Reply

Body = dict[str, Any]
WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped: "Don't know." -> ["don't", "know"]."""
    return WORD.findall(text.lower())


def overlap(ground_truth: str, answer: str) -> tuple[float, float]:
    """(share of the ground truth's words found in the answer, share of the answer's in it)."""
    truth, said = words(ground_truth), words(answer)
    completeness = sum(word in set(said) for word in truth) / len(truth) if truth else 0.0
    conciseness = sum(word in set(truth) for word in said) / len(said) if said else 0.0
    return completeness, conciseness


def delimited(body: Body, tag: str) -> str | None:
    """The text between <tag> and </tag> in the request's first user message."""
    user = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
    found = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", str(user.get("content", "")), re.DOTALL)
    return found.group(1) if found else None


def reply(body: Body, completeness: float, conciseness: float) -> Reply:
    """The grades as JSON, as integers 0-10 when the request's schema asks for them."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    if schema.get("properties", {}).get("completeness", {}).get("maximum") == 10:
        completeness, conciseness = round(completeness * 10), round(conciseness * 10)
    grades = {"reasoning": "word overlap", "completeness": completeness}
    return Reply(content=json.dumps({**grades, "conciseness": conciseness}))


def judge(grade: Callable[[str, str], tuple[float, float]]) -> Callable[[Body], Reply | None]:
    """A responder that grades (ground truth, answer) with `grade`."""

    def respond(body: Body) -> Reply | None:
        truth, answer = delimited(body, "ground_truth"), delimited(body, "answer")
        if truth is None or answer is None:
            return None
        return reply(body, *grade(truth, answer))

    return respond


# Grades computed from the texts: word overlap.
truthful = judge(overlap)
# 0.8 and 0.8 whatever it is shown.
constant = judge(lambda truth, answer: (0.8, 0.8))
# Word overlap for completeness, but every answer is concise: padding costs nothing.
lenient_about_padding = judge(lambda truth, answer: (overlap(truth, answer)[0], 1.0))
