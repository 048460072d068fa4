"""Verifying harder questions: multi-hop ones with the answerer and the judge's verdicts on
key points, unanswerable ones with the judge's reading of the store's chunks.

A multi-hop question is kept when the answerer, given both its chunks, states every key point
(none absent), and given either chunk alone leaves at least one out (absent): it needs both.
Its checks stop at the first that fails; each is an answer call (the answer prompt) and a
judge call: the judge that grades by key points (marking.KeyPointGrader, one re-ask when its
verdicts do not fit), recorded with its verdicts.

An unanswerable question is kept when the judge model, reading the store's chunks nearest to
it, finds none that states its answer, even in part (one call, the verify_unanswerable
prompt). Not when an answerer declines: that would keep only the questions a model declines,
and drop those that lead it to make an answer up, which are the ones the question is there to
catch; with the built-in answerer, the same model and chunks as the check's, the exam would
find no made-up answer by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, Field

from ragexam.analysis.keypoints import dump
from ragexam.config import Settings
from ragexam.io.cells import UNANSWERABLE
from ragexam.llm.client import LLM, Reply
from ragexam.llm.prompts import Prompt, context_block, load_prompt
from ragexam.rag.retrieval import Retriever
from ragexam.stages.exams import Exam
from ragexam.stages.marking import KeyPointGrader, quoted
from ragexam.stages.session import Session

ABSENT = "absent"
# Chunks the check of an unanswerable question reads: twice answer's default k, so that a
# system retrieving more than the default still rarely finds an answer the check missed.
NEAREST = 10


class Answerability(BaseModel):
    """What the check of an unanswerable question returns."""

    quote: str = Field(
        "",
        description="The sentence of a passage stating the answer, word for word; empty if none.",
    )
    answered: bool = Field(
        description="Whether any passage states the answer, in whole or in part."
    )


@dataclass(frozen=True)
class Reading:
    """The check of an unanswerable question: the nearest chunks, what the reader said of
    them (its verdict, its quote, whether the quote is the chunks' own words), and whether
    they answer it: by its verdict, or by its quote when the chunks say it."""

    said: bool
    quote: str
    found: bool
    chunks: tuple[str, ...]

    @property
    def answered(self) -> bool:
        """Whether the chunks answer the question."""
        return self.said or self.found

    def record(self) -> dict[str, Any]:
        """What the row's `verification` keeps of it."""
        read = {"answered": self.answered, "said": self.said, "quote": self.quote}
        return {
            "context": "nearest",
            **read,
            "quote_found": self.found,
            "chunks": list(self.chunks),
        }


class Written(Protocol):
    """A harder question as its writer wrote it."""

    question: str
    answer: str
    key_points: list[str]


@dataclass(frozen=True)
class Check:
    """One check: the context the answerer was given, its answer and the judge's verdicts."""

    context: str  # both, first, second, nearest
    answer: str
    verdicts: tuple[str, ...]
    statements: tuple[str, ...]
    chunks: tuple[str, ...] = ()  # the nearest chunks' ids, for an unanswerable question

    def record(self) -> dict[str, Any]:
        """What the row's `verification` keeps of it."""
        found = {"context": self.context, "key_points": list(self.verdicts)}
        found["statements"] = list(self.statements)
        return found | ({"chunks": list(self.chunks)} if self.chunks else {})


@dataclass(frozen=True)
class Verdict:
    """Kept or dropped, why, and the checks that decided it."""

    kept: bool
    reason: str
    checks: tuple[Check | Reading, ...]


@dataclass
class Tally:
    """What one row's calls cost: calls, and tokens in and out."""

    calls: int = 0
    tokens: list[int] = field(default_factory=lambda: [0, 0])

    def add(self, *replies: Reply[Any]) -> None:
        """Count successful calls."""
        for reply in replies:
            self.calls += 1
            self.tokens[0] += reply.prompt_tokens
            self.tokens[1] += reply.completion_tokens


class Verifier:
    """The answerer (the answer prompt and model) and the judge model: it grades by key points
    (multi-hop questions) and reads the nearest chunks (unanswerable ones)."""

    def __init__(self, settings: Settings, session: Session, retriever: Retriever | None) -> None:
        memory = session.endpoints
        self.answer_prompt: Prompt = load_prompt("answer", settings.prompts_dir)
        self.grader = KeyPointGrader(settings.prompts_dir, with_context=False)
        bound = settings.max_tokens_for("answer")
        self.answerer = LLM(settings, settings.model_for("answer"), max_tokens=bound, memory=memory)
        bound = settings.max_tokens_for("judge")
        judge = settings.model_for("judge")
        self.judge = LLM(settings, judge, temperature=0, max_tokens=bound, memory=memory)
        self.retriever = retriever  # None: no unanswerable question asked, none to check
        self.reader: Prompt | None = None
        if retriever is not None:
            self.reader = load_prompt("verify_unanswerable", settings.prompts_dir)

    async def pair(self, written: Written, texts: tuple[str, str], tally: Tally) -> Verdict:
        """Kept when both chunks answer it and neither alone does."""
        checks = [await self.check("both", written, list(texts), tally)]
        if ABSENT in checks[0].verdicts:
            return Verdict(False, "not answerable from both chunks", tuple(checks))
        for name, text in zip(("first", "second"), texts, strict=True):
            checks.append(await self.check(name, written, [text], tally))
            if ABSENT not in checks[-1].verdicts:
                return Verdict(False, f"answerable from the {name} chunk alone", tuple(checks))
        return Verdict(True, "", tuple(checks))

    async def unanswerable(self, written: Written, tally: Tally) -> Verdict:
        """Kept when the judge model finds that no chunk nearest to it answers it."""
        assert self.retriever is not None
        hits = (await self.retriever.retrieve([written.question]))[0]
        texts = [hit.text or "" for hit in hits]
        reply = await self.judge.structured(self.reading(written.question, texts), Answerability)
        tally.add(reply)
        quote = reply.value.quote
        found = bool(quote.strip()) and quoted(quote, "\n".join(texts))
        # a quote of the chunks that states the answer is an answer, whatever the verdict says
        reading = Reading(reply.value.answered, quote, found, _ids(hits))
        if reading.answered:
            return Verdict(False, "answered by the nearest chunks", (reading,))
        return Verdict(True, "", (reading,))

    def reading(self, question: str, texts: list[str]) -> list[BaseMessage]:
        """The prompt of the check of an unanswerable question."""
        assert self.reader is not None
        values = self.reader.fill(question=question, context=context_block(texts))
        return self.reader.template.format_messages(**values)

    async def check(self, context: str, written: Written, texts: list[str], tally: Tally) -> Check:
        """The answerer given `texts`, and the judge's verdicts on its answer."""
        values = self.answer_prompt.fill(question=written.question, context=context_block(texts))
        answer = await self.answerer.text(self.answer_prompt.template.format_messages(**values))
        tally.add(answer)
        marked = await self.grader.sample(self.judge, self.exam(written, answer.value))
        tally.add(*marked.replies)
        verdicts = tuple(mark.verdict for mark in marked.marks.key_points)
        statements = tuple(mark.verdict for mark in marked.marks.answer_statements)
        return Check(context, answer.value, verdicts, statements)

    @staticmethod
    def exam(written: Written, answer: str) -> Exam:
        """What the judge is shown: the question, its ground truth, key points and the answer."""
        points = dump(written.key_points)
        return Exam("", written.question, written.answer, answer, key_points=points)

    def prompts(
        self, written: Written, texts: list[str], answer: str
    ) -> tuple[list[BaseMessage], list[BaseMessage]]:
        """A multi-hop check's two prompts, the answerer's and the judge's (for the dry run)."""
        values = self.answer_prompt.fill(question=written.question, context=context_block(texts))
        asked = self.answer_prompt.template.format_messages(**values)
        return asked, self.grader.messages(self.exam(written, answer))

    def fingerprint(self, kind: str) -> tuple[str, ...]:
        """What a verdict on a question of this kind depends on beside it: prompts and models."""
        if kind == UNANSWERABLE:
            assert self.reader is not None
            return (self.reader.hash, self.judge.model)
        prompts = (self.answer_prompt.hash, self.grader.prompt.hash)
        return (*prompts, self.answerer.model, self.judge.model)

    def prompt_hashes(self) -> dict[str, str]:
        """The prompts of the checks, by name."""
        prompts = (self.answer_prompt, self.grader.prompt, self.reader)
        return {prompt.name: prompt.hash for prompt in prompts if prompt is not None}

    def figures(self) -> dict[str, Any]:
        """Each model's calls and tokens, for the manifest and the price."""
        return {
            role: {"model": llm.model, "calls": llm.calls, "tokens_billed": _billed(llm)}
            for role, llm in (("answer", self.answerer), ("judge", self.judge))
        }

    async def aclose(self) -> None:
        """Close both models' connections and the embedder's."""
        await self.answerer.aclose()
        await self.judge.aclose()
        if self.retriever is not None:
            await self.retriever.embedder.aclose()


def _billed(llm: LLM) -> dict[str, int]:
    return {"prompt": llm.tokens[0], "completion": llm.tokens[1]}


def _ids(hits: list[Any]) -> tuple[str, ...]:
    return tuple(str(hit.id) for hit in hits)
