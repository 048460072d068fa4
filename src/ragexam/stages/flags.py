"""Question checks: cheap ones on every row with no LLM call, and the critic's with `--check`.

A flag marks an exam question that may not measure what it should: one that points at "the
passage" (a user never would), one that gives its answer away, a duplicate, one written from
a chunk too short to hold much, and, with `--check`, one the critic finds not standalone,
not answerable from its chunk, or with an answer the chunk does not support.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

from ragexam.analysis.keypoints import stripped

SHORT_CHUNK = 100  # characters; a shorter chunk rarely holds a question worth asking
REFERS_TO_TEXT = re.compile(
    r"\b(?:the|this|that|these|above|given|provided|following)\s+"
    r"(?:chunk|text|passage|excerpt|document|context)s?\b",
    re.IGNORECASE,
)
SEPARATOR = ";"


class Written(BaseModel):
    """What every exam writer's reply must hold, whatever its fields say: a question and an
    answer that are not blank, and key points none of which is blank (all stripped)."""

    @field_validator("question", "answer", check_fields=False)
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()

    @field_validator("key_points", check_fields=False)
    @classmethod
    def _points(cls, points: list[str]) -> list[str]:
        return stripped(points)


class Critique(BaseModel):
    """What the critic must return for one question."""

    reasoning: str = Field(description="Briefly, why each answer is yes or no.")
    standalone: bool = Field(description="The question makes sense without seeing the chunk.")
    answerable: bool = Field(description="The chunk answers the question.")
    supported: bool = Field(description="Every fact of the answer is stated in the chunk.")


CRITIC_FLAGS = {
    "standalone": "not_standalone",
    "answerable": "not_answerable",
    "supported": "unsupported_answer",
}


def normalise(text: str) -> str:
    """Lower case, words only, single spaces: how questions and answers are compared."""
    return " ".join(re.findall(r"\w+", text.lower()))


def cheap_flags(question: str, truth: str, chunk_chars: int, earlier: set[str]) -> list[str]:
    """The flags that need no LLM call; `earlier` holds the normalised questions before this one."""
    flags = []
    if REFERS_TO_TEXT.search(question):
        flags.append("refers_to_text")
    answer = normalise(truth)
    if answer and f" {answer} " in f" {normalise(question)} ":
        flags.append("answer_in_question")
    if normalise(question) in earlier:
        flags.append("duplicate_question")
    if chunk_chars < SHORT_CHUNK:
        flags.append("short_chunk")
    return flags


def critic_flags(critique: Critique) -> list[str]:
    """A flag for each check the critic answered no."""
    return [flag for check, flag in CRITIC_FLAGS.items() if not getattr(critique, check)]


def join_flags(flags: list[str]) -> str:
    """The `flags` cell: names joined by ';', empty when clean."""
    return SEPARATOR.join(flags)
