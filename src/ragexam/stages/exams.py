"""What the judge grades: each ok answer joined to its question, ground truth and key points.

The exam's key points are its own `key_points` cells, else those judge wrote once into
`key_points.csv` for an exam without them. With --with-context, the retrieved chunks the
answer was given come from answers.csv's `retrieved_texts`.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ragexam.analysis.keypoints import merged_key_points, written_key_points
from ragexam.config import Scale
from ragexam.errors import ConfigError, InputFileError
from ragexam.io.cells import KINDS, NOT_A_KIND, SINGLE, id_list, question_chunks
from ragexam.io.csvfile import read_columns
from ragexam.io.fingerprint import answer_hash, input_hash
from ragexam.io.runfolder import RunFolder, answered_as_it_is
from ragexam.options import Given

logger = logging.getLogger("ragexam")
INPUTS = ("qa_dataset", "answers")  # the manifest's names for the files judge reads


class Exam(NamedTuple):
    """One answered question: what the judge is shown.

    A tuple of strings, which the cycle collector stops tracking: a 100,000-row exam as frozen
    dataclasses made its first full pass after reading cost 0.06-0.13 s more.
    """

    qa_id: str
    question: str | None
    ground_truth: str | None
    answer: str
    document: str = ""
    key_points: str | None = None  # the JSON cell; None when the exam has none for it
    context: str | None = None  # retrieved_texts (JSON), read only for --with-context
    kind: str = SINGLE  # single, multi-hop or unanswerable

    @property
    def input_hash(self) -> str:
        """What a grade on the unit or ten scale is made from: question, ground truth, answer."""
        return input_hash(self.question, self.ground_truth, self.answer)


@dataclass(frozen=True)
class Exams:
    """The answers to grade, the error answers skipped, and the scale they are graded on."""

    exams: list[Exam]
    skipped: int
    scale: Scale
    asked: bool  # the scale was given, not chosen by the exam

    @property
    def lacking(self) -> list[Exam]:
        """The gradable answers whose question has no key points yet."""
        return [e for e in self.exams if e.key_points is None and e.question and e.ground_truth]


def inputs(given: Given) -> tuple[Path, Path]:
    """The exam (given, in the run folder, or where `answer` recorded it) and the answers."""
    folder = RunFolder(given.out)
    return given.inputs.qa_dataset or folder.exam(), given.inputs.answers or folder.answers


def load_exams(given: Given) -> Exams:
    """The answers to grade, and the scale: --scale, else key-points when the exam has any."""
    qa_path, answers_path = inputs(given)
    context = given.grading.with_context
    exams, skipped = read_exams(qa_path, answers_path, RunFolder(given.out).key_points, context)
    asked = given.grading.scale
    has_points = any(exam.key_points is not None for exam in exams)
    scale = asked or (Scale.key_points if has_points else Scale.unit)
    if context and scale is not Scale.key_points:
        raise ConfigError(
            f"--with-context needs the key-points scale, not {scale.value}: the judge says for "
            "each missed key point whether the retrieved chunks held it"
        )
    return Exams(exams[: given.calls.limit], skipped, scale, asked is not None)


def read_exams(
    qa_path: Path, answers_path: Path, key_points: Path | None = None, context: bool = False
) -> tuple[list[Exam], int]:
    """Answered questions joined on qa_id, and the count of error answers skipped; those
    answered for another version of their question are left out (when the exam is not the
    file `answer` read, and the answers say what they were made from)."""
    check = not answered_as_it_is(qa_path, answers_path) and _has(answers_path, "input_hash")
    sources = ("chunk_id", "chunk_ids") if check else ()  # a million ids, read when needed
    qa = read_columns(
        qa_path,
        ("qa_id", "question", "ground_truth_answer"),
        key="qa_id",
        filled=("question", "ground_truth_answer"),
        optional=("document", "kind", "key_points", *sources),
    )
    _check_kinds(qa_path, qa)
    points = merged_key_points(qa, written_key_points(key_points) if key_points else {})
    wanted = ("qa_id", "answer", "status", *(("retrieved_texts",) if context else ()))
    made = ("input_hash",) if check else ()
    answers = read_columns(answers_path, wanted, key="qa_id", optional=made)
    ok = [i for i, status in enumerate(answers["status"]) if status == "ok"]
    ids, replies = [answers["qa_id"][i] for i in ok], [answers["answer"][i] for i in ok]
    exams = _joined(qa, points, ids, replies)
    if context:
        texts = answers["retrieved_texts"]
        exams = [exam._replace(context=texts[i]) for exam, i in zip(exams, ok, strict=True)]
    if check and "input_hash" in answers:
        made_from = [answers["input_hash"][i] for i in ok]
        exams = _current(exams, made_from, asked_now(qa))
    return exams, len(answers["status"]) - len(ok)


def _has(path: Path, column: str) -> bool:
    """Whether a CSV's header names the column (False when it cannot be read: read_columns
    then says why)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            return column in next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


def _check_kinds(path: Path, qa: Mapping[str, Sequence[str]]) -> None:
    """Refuse a question of no kind before any paid call (stats would refuse it after)."""
    kinds, size = qa.get("kind"), len(qa["qa_id"])
    for n, status in enumerate(qa.get("status", [""] * size)):
        if kinds is not None and kinds[n] not in ("", *KINDS) and status in ("ok", ""):
            qa_id = qa["qa_id"][n]
            raise InputFileError(path, f"the row of qa_id {qa_id!r} has status ok but {NOT_A_KIND}")


def asked_now(qa: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """What an answer to each question of the exam is made from now (answer's input hash)."""
    size = len(qa["qa_id"])
    chunk, chunks = qa.get("chunk_id", [""] * size), qa.get("chunk_ids")
    hashes = {}
    for n, qa_id in enumerate(qa["qa_id"]):
        listed = (id_list(chunks[n]) or ()) if chunks is not None and chunks[n] else ()
        sources = question_chunks(chunk[n], listed)  # as answer reads them
        hashes[qa_id] = answer_hash(qa["question"][n], qa["ground_truth_answer"][n], sources)
    return hashes


def _current(exams: list[Exam], made_from: list[str], now: Mapping[str, str]) -> list[Exam]:
    """The exams whose answer was made for their question as the exam asks it now: an answer
    to a question edited since (or its ground truth, or its sources) is no answer to grade,
    until `answer` redoes it. Those left out are logged once."""
    stale = [
        exam.qa_id
        for exam, made in zip(exams, made_from, strict=True)
        if made and exam.qa_id in now and made != now[exam.qa_id]
    ]
    if not stale:
        return exams
    one = len(stale) == 1
    logger.warning(
        f"{len(stale)} answer{'' if one else 's'} ({', '.join(stale[:3])}"
        f"{', …' if len(stale) > 3 else ''}) {'was' if one else 'were'} made for another version "
        f"of {'its' if one else 'their'} question (the exam changed since): not graded; rerun "
        "`answer` to answer it as it is now"
    )
    left = set(stale)
    return [exam for exam in exams if exam.qa_id not in left]


def _joined(
    qa: Mapping[str, Sequence[str]], points: list[str | None], ids: list[str], replies: list[str]
) -> list[Exam]:
    """The exam of each answer, by its qa_id's row of the qa dataset: without an ok one, the
    question and ground truth are None (and the document empty without a row)."""
    size = len(qa["qa_id"])
    usable = [status in ("ok", "") for status in qa.get("status", ())] + [False]
    questions: list[str | None] = [*qa["question"], None]  # a last row for ids without one
    truths: list[str | None] = [*qa["ground_truth_answer"], None]
    if not all(usable[:-1]):
        questions = [text if ok else None for text, ok in zip(questions, usable, strict=True)]
        truths = [text if ok else None for text, ok in zip(truths, usable, strict=True)]
    documents = [*qa.get("document", [""] * size), ""]
    marking = [*points, None]
    kinds = [*(kind or SINGLE for kind in qa.get("kind", [SINGLE] * size)), SINGLE]
    where = dict(zip(qa["qa_id"], range(size), strict=True))
    rows = [where.get(qa_id, size) for qa_id in ids]
    question, truth = map(questions.__getitem__, rows), map(truths.__getitem__, rows)
    document, scheme = map(documents.__getitem__, rows), map(marking.__getitem__, rows)
    contexts, kind = [None] * len(rows), map(kinds.__getitem__, rows)
    return list(map(Exam, ids, question, truth, replies, document, scheme, contexts, kind))
