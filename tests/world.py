"""A world whose right answers are known: chunks state facts, and the fake models act on them.

Each chunk is a record that states three facts, distinct tokens such as `fact2x3b`. Through
FakeOpenAI's hooks, the exam writer asks which facts a record states (one key point per fact);
the answerer repeats the facts of the record that it finds in its context (or, closed-book,
those it "knows"; for a `forgetful` document only the first); the judge grades by the share
of facts in common, or by key points gives each a verdict from the facts the answer states (and
says whether the context it is shown holds them); and the embedder sends each question to its
record's chunk, or, for a document the retriever must always miss, as far from it as can be.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chromadb
from chromadb.api.client import SharedSystemClient
from openai_server import JSON, Reply

TAG = re.compile(r"\brec(\d+)x(\d+)\b")
FACT = re.compile(r"\bfact\d+x\d+[a-z]\b")
DONT_KNOW = "I don't know."


def section(text: str, name: str) -> str:
    """The text between <name> and </name>, or nothing."""
    found = re.search(rf"<{name}>(.*?)</{name}>", text, re.DOTALL)
    return found.group(1) if found else ""


@dataclass
class World:
    """Documents of records; `missed` ones are never retrieved, `known` ones need no context,
    and the answers about `forgetful` ones state only their record's first fact."""

    documents: dict[str, int]
    missed: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)
    forgetful: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.names = list(self.documents)
        self.records = [
            (d, i) for d, name in enumerate(self.names) for i in range(self.documents[name])
        ]
        self.slot = {record: number for number, record in enumerate(self.records)}

    # -- the chunks, the exam and the right answers -------------------------------------------

    @staticmethod
    def facts(d: int, i: int) -> list[str]:
        """The three facts record (d, i) states."""
        return [f"fact{d}x{i}{letter}" for letter in "abc"]

    def text(self, d: int, i: int) -> str:
        """The chunk of record (d, i): its tag, its facts, and a sentence of filler."""
        a, b, c = self.facts(d, i)
        return (
            f"Record rec{d}x{i} of {self.names[d]} states {a}, {b} and {c}. "
            "It is kept in the archive together with the other records of its document."
        )

    @staticmethod
    def question(d: int, i: int) -> str:
        """The exam question about record (d, i)."""
        return f"Which facts does record rec{d}x{i} state?"

    def truth(self, d: int, i: int) -> str:
        """The ground truth of that question."""
        a, b, c = self.facts(d, i)
        return f"{a}, {b} and {c}."

    def key_points(self, d: int, i: int) -> list[str]:
        """The marking scheme of that question: one key point per fact."""
        return [f"The record states {fact}." for fact in self.facts(d, i)]

    # -- the store and the embedder -----------------------------------------------------------

    def vector(self, d: int, i: int, sign: float = 1.0) -> list[float]:
        """A unit vector on the record's own axis."""
        vector = [0.0] * len(self.records)
        vector[self.slot[(d, i)]] = sign
        return vector

    def embed(self, text: str) -> list[float]:
        """A question's vector: its record's axis, or the opposite one for a missed document."""
        found = TAG.search(text)
        if found is None:
            return [1.0 / len(self.records) ** 0.5] * len(self.records)
        d, i = int(found.group(1)), int(found.group(2))
        return self.vector(d, i, -1.0 if self.names[d] in self.missed else 1.0)

    def build_store(self, path: Path, collection: str = "world") -> Path:
        """A persisted Chroma store of every record, with the world's vectors."""
        client = chromadb.PersistentClient(str(path))
        store = client.create_collection(collection)
        store.add(
            ids=[f"c{d}-{i}" for d, i in self.records],
            documents=[self.text(d, i) for d, i in self.records],
            embeddings=[self.vector(d, i) for d, i in self.records],  # type: ignore[arg-type]
            metadatas=[{"source": self.names[d]} for d, _ in self.records],
        )
        SharedSystemClient.clear_system_cache()
        return path

    # -- the models ---------------------------------------------------------------------------

    def respond(self, body: JSON) -> Reply | None:
        """The reply of whichever model the prompt addresses; None leaves it to the server."""
        messages = body.get("messages") or []
        system = str(messages[0].get("content", "")) if messages else ""
        user = str(messages[-1].get("content", "")) if messages else ""
        if system.startswith("You write exam questions"):
            return self.write(user)
        if system.startswith("You answer questions using only the context"):
            question = section(user, "question")
            return Reply(
                content=self.answer(question, section(user, "context"), self.forgets(question))
            )
        if system.startswith("You answer questions from what you already know"):
            return Reply(content=self.recall(section(user, "question")))
        if system.startswith("You are a strict, fair grader"):
            return Reply(content=grade(section(user, "ground_truth"), section(user, "answer")))
        if system.startswith("You mark an answer against a marking scheme"):
            return Reply(content=mark(user))
        if system.startswith("You write the marking scheme"):
            facts = FACT.findall(section(user, "ground_truth"))
            points = [f"The record states {fact}." for fact in facts]
            return Reply(content=json.dumps({"key_points": points}))
        return None

    def forgets(self, question: str) -> bool:
        """Whether the question is about a forgetful document."""
        found = TAG.search(question)
        return found is not None and self.names[int(found.group(1))] in self.forgetful

    def write(self, prompt: str) -> Reply:
        """The exam writer: the question and ground truth of the chunk's record."""
        found = TAG.search(section(prompt, "chunk"))
        assert found is not None, prompt
        d, i = int(found.group(1)), int(found.group(2))
        written = {
            "question": self.question(d, i),
            "answer": self.truth(d, i),
            "key_points": self.key_points(d, i),
        }
        return Reply(content=json.dumps(written))

    @staticmethod
    def answer(question: str, context: str, forgetful: bool = False) -> str:
        """Repeat the facts of the asked record's chunk (only the first, if forgetful), if the
        context holds it."""
        found = TAG.search(question)
        for block in re.findall(r"<chunk[^>]*>(.*?)</chunk>", context, re.DOTALL):
            if found is not None and found.group(0) in block:
                facts = FACT.findall(block)
                return ", ".join(facts[:1] if forgetful else facts) + "."
        return "The context does not contain the answer."

    def recall(self, question: str) -> str:
        """Closed-book: the facts of a record of a known document, else "I don't know"."""
        found = TAG.search(question)
        if found is None or self.names[int(found.group(1))] not in self.known:
            return DONT_KNOW
        return ", ".join(self.facts(int(found.group(1)), int(found.group(2)))) + "."


def mark(prompt: str) -> str:
    """The judge by key points: present when the answer states the point's fact, the context
    (when shown) read the same way; each fact the answer states is one statement, supported
    when the ground truth states it too."""
    answer, truth, context = section(prompt, "answer"), section(prompt, "ground_truth"), None
    if "<context>" in prompt:
        context = section(prompt, "context")
    stated, wanted = FACT.findall(answer), set(FACT.findall(truth))
    marks = []
    for point in section(prompt, "key_points").strip().splitlines():
        fact = FACT.search(point)
        present = fact is not None and fact.group(0) in stated
        mark: dict[str, Any] = {
            "point": point,
            "verdict": "present" if present else "absent",
            "evidence": fact.group(0) if present and fact else "",
        }
        if context is not None:
            mark["in_context"] = fact is not None and fact.group(0) in context
        marks.append(mark)
    statements = [
        {"statement": fact, "verdict": "supported" if fact in wanted else "unsupported"}
        for fact in stated
    ]
    return json.dumps({"key_points": marks, "answer_statements": statements})


def grade(truth: str, answer: str) -> str:
    """The judge: completeness and conciseness as shares of facts in common."""
    wanted, given = set(FACT.findall(truth)), set(FACT.findall(answer))
    common = len(wanted & given)
    grades: dict[str, Any] = {
        "reasoning": f"{common} of {len(wanted)} facts present, {len(given)} given",
        "completeness": common / len(wanted) if wanted else 0.0,
        "conciseness": common / len(given) if given else 0.0,
    }
    return json.dumps(grades)
