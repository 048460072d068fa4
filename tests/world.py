"""A world whose right answers are known: chunks state facts, and the fake models act on them.

Each chunk is a record that states three facts, distinct tokens such as `fact2x3b`. Through
FakeOpenAI's hooks, the exam writer asks which facts a record states (one key point per fact);
the answerer repeats the facts of the records that it finds in its context (or, closed-book,
those it "knows"; for a `forgetful` document only the first); the judge grades by the share
of facts in common, or by key points gives each a verdict from the facts the answer states (and
says whether the context it is shown holds them); and the embedder sends each question to its
records' chunks, or, for a document the retriever must always miss, as far from it as can be.

Harder exams: records are linked, neighbours in a document and `partners` across documents
(their vectors lie close), so that a question on two records has a known right answer, six
facts, and one chunk alone gives half of it. Verification can fail: a record in `repeats`
restates the facts of the record before it (a pair of them is answered by one chunk), the
writer adds a fact no chunk states about a record in `invents` (the pair cannot answer it),
and asks about a record that exists instead of a missing one for a record in `answered`. An
answerer in a world whose `guesses` name a document makes up the facts of its missing records.
A world in French (`language="fr"`) has French chunks, and its writer writes French only
when the prompt asks for the chunk's language: left alone it writes English, as models do.
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
CHUNK = r"<chunk[^>]*>(.*?)</chunk>"  # the text of each delimited chunk
MISSING = 1000  # an unanswerable question asks about record i + MISSING, which no chunk holds
Record = tuple[int, int]
# What the world's models write, in English and in French.
WORDS = {
    "en": {
        "chunk": "Record rec{d}x{i} of {name} states {facts}. It is kept in the archive "
        "together with the other records of its document.",
        "one": "Which facts does record rec{d}x{i} state?",
        "two": "Which facts do records rec{d}x{i} and rec{e}x{j} state?",
        "and": " and ",
        "not_there": "The context does not contain the answer.",
        "not_said": "The documents do not say which facts record rec{d}x{i} states.",
        "language": "English",
    },
    "fr": {
        "chunk": "L'enregistrement rec{d}x{i} de {name} indique {facts}. Il est conservé aux "
        "archives avec les autres enregistrements de son document.",
        "one": "Quels faits l'enregistrement rec{d}x{i} indique-t-il ?",
        "two": "Quels faits les enregistrements rec{d}x{i} et rec{e}x{j} indiquent-ils ?",
        "and": " et ",
        "not_there": "Le contexte ne contient pas la réponse.",
        "not_said": "Les documents ne disent pas quels faits l'enregistrement rec{d}x{i} indique.",
        "language": "French",
    },
}
ASKS_LANGUAGE = re.compile(r"language of the (?:first )?chunk", re.IGNORECASE)
DECLINES = ("does not contain", "do not say", "ne contient pas", "ne disent pas", "don't know")


def section(text: str, name: str) -> str:
    """The text between <name> and </name>, or nothing."""
    found = re.search(rf"<{name}>(.*?)</{name}>", text, re.DOTALL)
    return found.group(1) if found else ""


def listed(facts: list[str], language: str = "en") -> str:
    """a, b and c."""
    if len(facts) < 2:
        return "".join(facts)
    return ", ".join(facts[:-1]) + WORDS[language]["and"] + facts[-1]


@dataclass
class World:
    """Documents of records; `missed` ones are never retrieved, `known` ones need no context,
    and the answers about `forgetful` ones state only their record's first fact."""

    documents: dict[str, int]
    missed: set[str] = field(default_factory=set)
    known: set[str] = field(default_factory=set)
    forgetful: set[str] = field(default_factory=set)
    language: str = "en"
    partners: dict[Record, Record] = field(default_factory=dict)  # one way; linked both ways
    repeats: set[Record] = field(default_factory=set)
    invents: set[Record] = field(default_factory=set)
    answered: set[Record] = field(default_factory=set)
    guesses: set[str] = field(default_factory=set)  # documents whose missing records it makes up
    # the check of unanswerable questions quotes the chunk that answers, yet says it does not
    misreads: bool = False

    def __post_init__(self) -> None:
        self.names = list(self.documents)
        self.records = [
            (d, i) for d, name in enumerate(self.names) for i in range(self.documents[name])
        ]
        self.slot = {record: number for number, record in enumerate(self.records)}
        self.linked = {**self.partners, **{b: a for a, b in self.partners.items()}}
        self.words = WORDS[self.language]

    # -- the chunks, the exam and the right answers -------------------------------------------

    @staticmethod
    def facts(d: int, i: int) -> list[str]:
        """The three facts record (d, i) states."""
        return [f"fact{d}x{i}{letter}" for letter in "abc"]

    def stated(self, d: int, i: int) -> list[str]:
        """The facts record (d, i)'s chunk states: its own, or the previous record's (`repeats`)."""
        return self.facts(d, i - 1) if (d, i) in self.repeats else self.facts(d, i)

    def text(self, d: int, i: int) -> str:
        """The chunk of record (d, i): its tag, its facts, and a sentence of filler."""
        facts = listed(self.stated(d, i), self.language)
        return self.words["chunk"].format(d=d, i=i, name=self.names[d], facts=facts)

    @staticmethod
    def question(d: int, i: int) -> str:
        """The exam question about record (d, i)."""
        return f"Which facts does record rec{d}x{i} state?"

    def truth(self, d: int, i: int) -> str:
        """The ground truth of that question."""
        return listed(self.facts(d, i)) + "."

    def key_points(self, d: int, i: int) -> list[str]:
        """The marking scheme of that question: one key point per fact its chunk states."""
        return points(self.stated(d, i))

    def pair_truth(self, first: Record, second: Record) -> list[str]:
        """The right answer to the question on two records: the facts their chunks state."""
        return list(dict.fromkeys([*self.stated(*first), *self.stated(*second)]))

    # -- the store and the embedder -----------------------------------------------------------

    def vector(self, d: int, i: int, sign: float = 1.0) -> list[float]:
        """A unit vector on the record's own axis, leaning towards its partner's if it has one."""
        vector = [0.0] * len(self.records)
        vector[self.slot[(d, i)]] = sign
        partner = self.linked.get((d, i))
        if partner is not None:
            vector[self.slot[partner]] = 0.8 * sign
        norm = sum(x * x for x in vector) ** 0.5
        return [x / norm for x in vector]

    def embed(self, text: str) -> list[float]:
        """A question's vector: its records' axes, or the opposite for a missed document."""
        found = [(int(d), int(i)) for d, i in TAG.findall(text)]
        found = [record for record in found if record in self.slot]
        if not found:
            return [1.0 / len(self.records) ** 0.5] * len(self.records)
        vector = [0.0] * len(self.records)
        for d, i in found:
            vector[self.slot[(d, i)]] = -1.0 if self.names[d] in self.missed else 1.0
        norm = sum(x * x for x in vector) ** 0.5
        return [x / norm for x in vector]

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
        asked = bool(ASKS_LANGUAGE.search(system))
        if system.startswith("You write exam questions that need two chunks"):
            return self.write_pair(user, asked)
        if system.startswith("You write exam questions that the documentation cannot answer"):
            return self.write_unanswerable(user, asked)
        if system.startswith("You write exam questions"):
            return self.write(user, asked)
        if system.startswith("You answer questions using only the context"):
            question = section(user, "question")
            context = section(user, "context")
            return Reply(content=self.answer(question, context, self.forgets(question)))
        if system.startswith("You check whether passages of a documentation answer"):
            return Reply(content=self.read(section(user, "question"), section(user, "context")))
        if system.startswith("You answer questions from what you already know"):
            return Reply(content=self.recall(section(user, "question")))
        if system.startswith("You are a strict, fair grader"):
            return Reply(content=grade(section(user, "ground_truth"), section(user, "answer")))
        if system.startswith("You mark an answer against a marking scheme"):
            return Reply(content=mark(user))
        if system.startswith("You write the marking scheme"):
            facts = FACT.findall(section(user, "ground_truth"))
            return Reply(content=json.dumps({"key_points": points(facts)}))
        return None

    def forgets(self, question: str) -> bool:
        """Whether the question is about a forgetful document."""
        found = TAG.search(question)
        return found is not None and self.names[int(found.group(1))] in self.forgetful

    def _language(self, asked: bool) -> dict[str, str]:
        """The words the writer writes in: the chunks' language if asked for it, else English."""
        return self.words if asked else WORDS["en"]

    def write(self, prompt: str, asked: bool = False) -> Reply:
        """The exam writer: the question and ground truth of the chunk's record."""
        found = TAG.search(section(prompt, "chunk"))
        assert found is not None, prompt
        d, i = int(found.group(1)), int(found.group(2))
        words = self._language(asked)
        facts = self.stated(d, i)
        reply = {
            "language": self.words["language"],
            "question": words["one"].format(d=d, i=i),
            "answer": listed(facts, self.language if asked else "en") + ".",
            "key_points": points(facts, self.language if asked else "en"),
        }
        return Reply(content=json.dumps(reply, ensure_ascii=False))

    def write_pair(self, prompt: str, asked: bool) -> Reply:
        """The question on two records: every fact their chunks state (and, for a record in
        `invents`, one that no chunk states)."""
        first, second = (_record(text) for text in re.findall(CHUNK, prompt, re.DOTALL))
        facts = self.pair_truth(first, second)
        if first in self.invents:
            facts.append(f"fact{first[0]}x{first[1]}z")
        words = self._language(asked)
        reply = {
            "language": self.words["language"],
            "question": words["two"].format(d=first[0], i=first[1], e=second[0], j=second[1]),
            "answer": listed(facts, self.language if asked else "en") + ".",
            "key_points": points(facts, self.language if asked else "en"),
        }
        return Reply(content=json.dumps(reply, ensure_ascii=False))

    def write_unanswerable(self, prompt: str, asked: bool) -> Reply:
        """A question on a record of the chunk's document that no chunk holds (or, for a record
        in `answered`, on the chunk's own record: the store answers it)."""
        d, i = _record(section(prompt, "chunk"))
        asked_about = i if (d, i) in self.answered else i + MISSING
        words = self._language(asked)
        truth = words["not_said"].format(d=d, i=asked_about)
        reply = {
            "language": self.words["language"],
            "question": words["one"].format(d=d, i=asked_about),
            "answer": truth,
            "key_points": [truth],
        }
        return Reply(content=json.dumps(reply, ensure_ascii=False))

    def answer(self, question: str, context: str, forgetful: bool = False) -> str:
        """Repeat the facts of the chunks of the asked records (only the first, if forgetful),
        if the context holds them."""
        tags = {match.group(0) for match in TAG.finditer(question)}
        facts: list[str] = []
        for block in re.findall(CHUNK, context, re.DOTALL):
            if any(tag in block for tag in tags):
                facts += FACT.findall(block)[:1] if forgetful else FACT.findall(block)
        if facts:
            return ", ".join(dict.fromkeys(facts)) + "."
        guessed = [(int(d), int(i)) for d, i in TAG.findall(question)]
        if guessed and self.names[guessed[0][0]] in self.guesses:
            d, i = guessed[0]
            return f"fact{d}x{i}a, fact{d}x{i}b and fact{d}x{i}c."  # made up: no chunk says so
        french = "Quels" in question
        return WORDS["fr" if french else "en"]["not_there"]

    def read(self, question: str, context: str) -> str:
        """The check of an unanswerable question: whether a chunk of the asked record answers
        it (that chunk quoted), whatever any answerer would say."""
        tags = {match.group(0) for match in TAG.finditer(question)}
        blocks = re.findall(CHUNK, context, re.DOTALL)
        found = [block.strip() for block in blocks if any(tag in block for tag in tags)]
        quote = found[0] if found else ""
        return json.dumps({"quote": quote, "answered": bool(found) and not self.misreads})

    def recall(self, question: str) -> str:
        """Closed-book: the facts of a record of a known document, else "I don't know"."""
        found = TAG.search(question)
        if found is None or self.names[int(found.group(1))] not in self.known:
            return DONT_KNOW
        return ", ".join(self.facts(int(found.group(1)), int(found.group(2)))) + "."


def _record(text: str) -> Record:
    found = TAG.search(text)
    assert found is not None, text
    return int(found.group(1)), int(found.group(2))


def grade(truth: str, answer: str) -> str:
    """The judge: completeness and conciseness as shares of facts in common (for a ground
    truth that the documents do not say, whether the answer declines and states no fact)."""
    wanted, given = set(FACT.findall(truth)), set(FACT.findall(answer))
    common = len(wanted & given)
    grades: dict[str, Any] = {
        "reasoning": f"{common} of {len(wanted)} facts present, {len(given)} given",
        "completeness": common / len(wanted) if wanted else float(declines(answer)),
        "conciseness": common / len(given) if given else float(not wanted and declines(answer)),
    }
    return json.dumps(grades)


def declines(text: str) -> bool:
    """Whether an answer says it cannot answer."""
    return any(phrase in text for phrase in DECLINES)


def points(facts: list[str], language: str = "en") -> list[str]:
    """One key point per fact."""
    said = "L'enregistrement indique" if language == "fr" else "The record states"
    return [f"{said} {fact}." for fact in facts]


def mark(prompt: str) -> str:
    """The judge by key points: a fact's point is present when the answer states the fact, a
    point without a fact (the documents do not say) when the answer declines; the context (when
    shown) is read the same way. Each fact the answer states is one statement, supported when
    the ground truth states it too; a decline states nothing."""
    answer, truth, context = section(prompt, "answer"), section(prompt, "ground_truth"), None
    if "<context>" in prompt:
        context = section(prompt, "context")
    stated, wanted = FACT.findall(answer), set(FACT.findall(truth))
    marks = []
    for point in section(prompt, "key_points").strip().splitlines():
        fact = FACT.search(point)
        if fact is None:  # the one key point of an unanswerable question
            present, evidence = declines(answer) and not stated, answer.strip()
        else:
            present, evidence = fact.group(0) in stated, fact.group(0)
        mark: dict[str, Any] = {
            "point": point,
            "verdict": "present" if present else "absent",
            "evidence": evidence if present else "",
        }
        if context is not None:
            mark["in_context"] = fact is not None and fact.group(0) in context
        marks.append(mark)
    statements = [
        {"statement": fact, "verdict": "supported" if fact in wanted else "unsupported"}
        for fact in stated
    ]
    return json.dumps({"key_points": marks, "answer_statements": statements})
