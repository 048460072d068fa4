"""Models for any corpus that copy sentences: a writer, an answerer and a judge by shared words.

The test server's default replies are shaped by the schema but say nothing; these say what a
careful but literal model would, so that the verification of harder questions can be run on a
real corpus (examples/corpus) through the test server. The writer asks about a chunk's first
sentence (both chunks' for a multi-hop question; for an unanswerable one, its subject in a
place the corpus never mentions); the answerer copies the context's sentences that share words
with the question, or declines; the judge finds a key point present when the answer holds most
of its words; the check of an unanswerable question finds it answered when the answerer would
copy a sentence. Set `respond` as FakeOpenAI.responder.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openai_server import Reply
from world import CHUNK, section

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
STOP = {"the", "and", "for", "are", "with", "that", "this", "from", "does", "what", "say", "about"}
STOP |= {"documentation"}
NOT_THERE = "The context does not contain the answer."
DECLINES = ("does not say", "does not contain", "do not say")
ELSEWHERE = "for a parcel sent to a research station in Antarctica"


def words(text: str) -> set[str]:
    """Content words: lower-cased, three letters or more, not a stop word."""
    return {w.lower() for w in WORD.findall(text) if len(w) > 2 and w.lower() not in STOP}


def sentences(text: str) -> list[str]:
    """The sentences of a text."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]


def subject(text: str) -> str:
    """A chunk's subject: the first six content words of its first sentence."""
    found = [w for w in WORD.findall(sentences(text)[0]) if w.lower() in words(text)]
    return " ".join(found[:6])


def respond(body: dict[str, Any]) -> Reply | None:
    """The reply of whichever model the prompt addresses; None leaves it to the server."""
    messages = body.get("messages") or []
    system = str(messages[0].get("content", "")) if messages else ""
    user = str(messages[-1].get("content", "")) if messages else ""
    chunks = re.findall(CHUNK, user, re.DOTALL)
    if system.startswith("You write exam questions that need two chunks"):
        first, second = (sentences(chunk)[0] for chunk in chunks)
        question = f"What does the documentation say about {subject(first)} and {subject(second)}?"
        return written(question, f"{first} {second}", [first, second])
    if system.startswith("You write exam questions that the documentation cannot answer"):
        about = subject(chunks[0])
        truth = f"The documentation does not say what applies to {about} {ELSEWHERE}."
        return written(f"What applies to {about} {ELSEWHERE}?", truth, [truth])
    if system.startswith("You write exam questions"):
        first = sentences(chunks[0])[0]
        return written(f"What does the documentation say about {subject(first)}?", first, [first])
    if system.startswith("You answer questions using only the context"):
        return Reply(content=answer(section(user, "question"), chunks))
    if system.startswith("You mark an answer against a marking scheme"):
        return Reply(content=mark(section(user, "key_points"), section(user, "answer")))
    if system.startswith("You check whether passages of a documentation answer"):
        found = answer(section(user, "question"), chunks)  # what the answerer would copy
        quote = "" if found == NOT_THERE else found
        return Reply(content=json.dumps({"quote": quote, "answered": bool(quote)}))
    return None


def written(question: str, truth: str, points: list[str]) -> Reply:
    """A writer's reply."""
    reply = {"language": "English", "question": question, "answer": truth, "key_points": points}
    return Reply(content=json.dumps(reply))


def declines(text: str) -> bool:
    """Whether a text says that the answer is not there."""
    return any(phrase in text.lower() for phrase in DECLINES)


def answer(question: str, chunks: list[str]) -> str:
    """The context's sentences that hold 80% of the words of a part of the question (the parts
    are joined by "and"), or a decline."""
    parts = [words(part) for part in question.split(" and ") if words(part)]
    found = [
        s
        for chunk in chunks
        for s in sentences(chunk)
        if any(len(part & words(s)) >= 0.8 * len(part) for part in parts)
    ]
    return " ".join(dict.fromkeys(found[:4])) if found else NOT_THERE


def mark(key_points: str, answer: str) -> str:
    """A key point is present when the answer holds 80% of its words (partial: 40%), quoting
    the answer's sentence that holds most of them; a statement is supported when the key points
    hold 60% of its words. An answer that declines states nothing."""
    points = [re.sub(r"^\d+\.\s*", "", line.strip()) for line in key_points.strip().splitlines()]
    said, held = sentences(answer), set().union(*(words(point) for point in points))
    verdicts = []
    for point in points:
        share = len(words(point) & words(answer)) / max(1, len(words(point)))
        if declines(point):  # the one key point of an unanswerable question
            share = float(declines(answer))
        verdict = "present" if share >= 0.8 else "partial" if share >= 0.4 else "absent"
        best = max(said, key=lambda s: len(words(s) & words(point)), default="")
        evidence = best if verdict != "absent" else ""
        verdicts.append({"point": point, "verdict": verdict, "evidence": evidence})
    statements = [
        {"statement": s, "verdict": "supported" if _share(s, held) >= 0.6 else "unsupported"}
        for s in ([] if declines(answer) else said)
    ]
    return json.dumps({"key_points": verdicts, "answer_statements": statements})


def _share(text: str, held: set[str]) -> float:
    return len(words(text) & held) / max(1, len(words(text)))
