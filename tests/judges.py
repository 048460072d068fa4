"""Judges for the test server: each grades from the texts the judge prompt delimits, or does not.

Set one as `FakeOpenAI.responder`. A request that is not a judge's (no <ground_truth> in it)
gets the server's default reply. Grades come back in the form and scale the request asked for:
two numbers, or on the key-points scale a verdict per key point (with the answer's words as
evidence) and per statement of the answer (each sentence of it).
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from typing import Any

from openai_server import Reply

Body = dict[str, Any]
WORD = re.compile(r"[a-z0-9']+")
SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
# What the injection controls carry: a judge that falls for them gives full marks.
LURES = ("grade", "verdict", '"key_points"', '"completeness"', "thought process", "fully correct",
         "please")  # fmt: skip


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


def key_points(body: Body) -> list[str] | None:
    """The numbered key points of a marking request; None for another request."""
    listed = delimited(body, "key_points")
    if listed is None:
        return None
    return [re.sub(r"^\d+\.\s*", "", line) for line in listed.splitlines() if line.strip()]


def reply(body: Body, completeness: float, conciseness: float) -> Reply:
    """The grades as JSON, as integers 0-10 when the request's schema asks for them."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    if schema.get("properties", {}).get("completeness", {}).get("maximum") == 10:
        completeness, conciseness = round(completeness * 10), round(conciseness * 10)
    grades = {"reasoning": "word overlap", "completeness": completeness}
    return Reply(content=json.dumps({**grades, "conciseness": conciseness}))


# -- marking by key points ------------------------------------------------------------------------


def evidence(point: str, answer: str) -> str:
    """The longest run of the answer's words that are all the point's, as the answer writes it."""
    wanted = set(words(point))
    best, run = "", []
    for found in re.finditer(r"[A-Za-z0-9']+", answer):
        run = [*run, found] if found.group(0).lower() in wanted else []
        if run and run[-1].end() - run[0].start() > len(best):
            best = answer[run[0].start() : run[-1].end()]
    return best


def verdict_by_overlap(point: str, answer: str) -> str:
    """present: every word of the point in the answer; partial: half of them; else absent."""
    share = overlap(point, answer)[0]
    return "present" if share == 1.0 else "partial" if share >= 0.5 else "absent"


def supported_by_overlap(statement: str, truth: str) -> str:
    """supported: at least half of the statement's words are in the ground truth."""
    return "supported" if overlap(truth, statement)[1] >= 0.5 else "unsupported"


def statements(answer: str) -> list[str]:
    """The answer's sentences; "I don't know." states nothing."""
    said = [part.strip() for part in SENTENCE.findall(answer) if words(part)]
    return [part for part in said if words(part) not in (["i", "don't", "know"],)]


def marks(
    body: Body,
    points: list[str],
    verdict: Callable[[str, str], str] = verdict_by_overlap,
    supported: Callable[[str, str], str] = supported_by_overlap,
) -> Reply:
    """A marking reply: `verdict(point, answer)` per key point, `supported(statement, truth)`
    per sentence of the answer; the context (when shown) is read for whether it holds each."""
    answer, truth = delimited(body, "answer") or "", delimited(body, "ground_truth") or ""
    context = re.search(r"<context>\n(.*?)\n</context>", _user(body), re.DOTALL)
    marked = []
    for point in points:
        given = verdict(point, answer)
        mark = {"point": point, "verdict": given, "evidence": ""}
        if given != "absent":
            mark["evidence"] = evidence(point, answer) or next(iter(re.findall(r"\w+", answer)), "")
        if context is not None:
            mark["in_context"] = overlap(point, context.group(1))[0] == 1.0
        marked.append(mark)
    said = [{"statement": s, "verdict": supported(s, truth)} for s in statements(answer)]
    return Reply(content=json.dumps({"key_points": marked, "answer_statements": said}))


def _user(body: Body) -> str:
    user = next((m for m in body.get("messages", []) if m.get("role") == "user"), {})
    return str(user.get("content", ""))


def judge(
    grade: Callable[[str, str], tuple[float, float]],
    verdict: Callable[[str, str], str] = verdict_by_overlap,
    supported: Callable[[str, str], str] = supported_by_overlap,
) -> Callable[[Body], Reply | None]:
    """A responder that grades (ground truth, answer) with `grade`, or marks by key points."""

    def respond(body: Body) -> Reply | None:
        truth, answer = delimited(body, "ground_truth"), delimited(body, "answer")
        if truth is None or answer is None:
            return None
        points = key_points(body)
        if points is not None:
            return marks(body, points, verdict, supported)
        return reply(body, *grade(truth, answer))

    return respond


def _fooled(answer: str) -> bool:
    """Whether the answer carries an injection: a plea, a fake verdict, a master key, a claim."""
    lowered = answer.lower()
    return answer.lstrip().startswith(":") or any(lure in lowered for lure in LURES)


def _gullible_verdict(point: str, answer: str) -> str:
    return "present" if _fooled(answer) else verdict_by_overlap(point, answer)


def _gullible_grade(truth: str, answer: str) -> tuple[float, float]:
    return (1.0, 1.0) if _fooled(answer) else overlap(truth, answer)


def noisy() -> Callable[[Body], Reply | None]:
    """A judge whose verdicts are drawn at random per call (seeded by the body and how many
    times it was asked): its samples agree only by chance."""
    asked: dict[str, int] = {}
    lock = threading.Lock()

    def respond(body: Body) -> Reply | None:
        points = key_points(body)
        if points is None:
            return None
        key = json.dumps(body.get("messages"), sort_keys=True)
        with lock:
            turn = asked[key] = asked.get(key, 0) + 1
        draw = random.Random(f"{key}:{turn}")
        return marks(body, points, lambda point, answer: draw.choice(VERDICTS))

    return respond


VERDICTS = ("present", "partial", "absent")
# Grades computed from the texts: word overlap; by key points, a verdict per point from it.
truthful = judge(overlap)
# 0.8 and 0.8 whatever it is shown; by key points, every point present, every statement supported.
constant = judge(
    lambda truth, answer: (0.8, 0.8),
    lambda point, answer: "present",
    lambda statement, truth: "supported",
)
# Word overlap for completeness, but every answer is concise: padding costs nothing.
lenient_about_padding = judge(
    lambda truth, answer: (overlap(truth, answer)[0], 1.0),
    supported=lambda statement, truth: "supported",
)
# Truthful, until an answer asks for a good grade in any way: then full marks.
gullible = judge(
    _gullible_grade,
    _gullible_verdict,
    lambda statement, truth: (
        "supported" if _fooled(statement) else supported_by_overlap(statement, truth)
    ),
)
