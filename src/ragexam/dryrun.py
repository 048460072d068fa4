"""--dry-run: what a stage would call and cost, from its rendered prompts, calling nothing.

The rows to do are those a real run would do after resuming. Calls are counted as a run
without failures makes them. Input tokens are estimated from each rendered prompt; output
tokens from the rows already done, when there are some, else from OUTPUT_TOKENS. `run`
estimates answer and judge before their inputs exist, from stand-in texts of those sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from ragexam.answer import ANSWERS_FILE, AnswerOptions, Question, read_questions
from ragexam.config import Settings
from ragexam.csvfile import read_rows
from ragexam.generate import QA_FILE, GenerateOptions, GeneratePlan, qa_id_for
from ragexam.judge import JUDGMENTS_FILE, Exam, JudgeOptions, JudgePlan, read_exams
from ragexam.pacing import estimate_tokens, text_tokens
from ragexam.prices import price_of
from ragexam.prompts import context_block, load_prompt
from ragexam.store import get_chunks, iter_chunks, open_collection, release

# Tokens per reply when no earlier row says: a question and its answer; an answer; a grade.
OUTPUT_TOKENS = {"generate": 60, "answer": 150, "judge": 80}
BATCH = 500


@dataclass(frozen=True)
class Estimate:
    """What one stage would do: rows, calls, tokens each way, and their cost (None: unknown)."""

    stage: str
    model: str
    rows: int
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None

    def record(self) -> dict[str, Any]:
        """As plain values."""
        return asdict(self)


def estimate(
    stage: str,
    model: str,
    rows: int,
    prompts: Iterable[list[BaseMessage]],
    settings: Settings,
    per_call: float | None = None,
) -> Estimate:
    """Count the calls and tokens of these prompts, and price them."""
    calls, tokens = 0, 0
    for messages in prompts:
        calls += 1
        tokens += estimate_tokens(messages)
    output = round(calls * (OUTPUT_TOKENS[stage] if per_call is None else per_call))
    price = price_of(model, settings)
    cost = price.cost(tokens, output) if price else None
    return Estimate(stage, model, rows, calls, tokens, output, cost)


def done_rows(path: Path, model: str, prompt_hash: str) -> tuple[set[str], float | None]:
    """The rows a real run would skip (`ok`, this model and prompt), and their output per call."""
    if not path.exists():
        return set(), None
    rows = [
        row
        for row in read_rows(path, ["qa_id", "status"])
        if row["status"] == "ok"
        and (row.get("model"), row.get("prompt_hash")) == (model, prompt_hash)
    ]
    calls = sum(int(row.get("attempts") or 0) for row in rows)
    output = sum(int(row.get("completion_tokens") or 0) for row in rows)
    return {row["qa_id"] for row in rows}, (output / calls if calls else None)


def estimate_generate(settings: Settings, options: GenerateOptions) -> Estimate:
    """generate: one call per chunk still to do, except empty chunks."""
    plan = GeneratePlan(settings, options, open_collection(options.store))
    try:
        done, per_call = done_rows(options.out / QA_FILE, plan.llm.model, plan.prompt.hash)
        rows, tasks = plan.tasks(done)
        prompts = (plan.messages(task) for task in tasks if str(task.payload).strip())
        return estimate("generate", plan.llm.model, rows, prompts, settings, per_call)
    finally:
        release(options.store)


def estimate_answer(settings: Settings, options: AnswerOptions) -> Estimate:
    """answer: one call per question still to do, with k chunks of its source's size."""
    questions, _ = read_questions(options.qa_path or options.out / QA_FILE)
    questions = questions[: options.limit]
    if options.rag is not None or options.store is None:  # ragexam itself calls nothing
        return Estimate("answer", f"rag:{options.rag}", len(questions), 0, 0, 0, None)
    model = settings.model_for("answer")
    prompt = load_prompt("answer", settings.prompts_dir)
    done, per_call = done_rows(options.out / ANSWERS_FILE, model, prompt.hash)
    pending = [question for question in questions if question.qa_id not in done]
    collection = open_collection(options.store)
    try:
        sources = _sources(collection, pending)
        prompts = (
            prompt.template.format_messages(
                **prompt.fill(question=q.text, context=context_block([text] * options.k))
            )
            for q, text in zip(pending, sources, strict=True)
            if q.text.strip()
        )
        return estimate("answer", model, len(pending), prompts, settings, per_call)
    finally:
        release(options.store)


def _sources(collection: Any, questions: list[Question]) -> Iterator[str]:
    """The text of each question's source chunk (empty when the store lacks it)."""
    for start in range(0, len(questions), BATCH):
        batch = questions[start : start + BATCH]
        texts = get_chunks(collection, [question.chunk_id for question in batch])
        yield from (texts.get(question.chunk_id, "") for question in batch)


def estimate_judge(settings: Settings, options: JudgeOptions) -> Estimate:
    """judge: `samples` calls per answer still to grade."""
    exams, _ = read_exams(
        options.qa_path or options.out / QA_FILE, options.answers_path or options.out / ANSWERS_FILE
    )
    return _judge(settings, options, exams[: options.limit])


def _judge(settings: Settings, options: JudgeOptions, exams: list[Exam]) -> Estimate:
    plan = JudgePlan(settings, options, exams)
    path = options.out / JUDGMENTS_FILE
    done, per_call = done_rows(path, plan.llm.model, plan.prompt.hash)
    rows, tasks = plan.tasks(done)
    graded = [task.payload for task in tasks if task.payload.question is not None]
    prompts = (plan.messages(exam) for exam in graded for _ in range(options.samples))
    return estimate("judge", plan.llm.model, rows, prompts, settings, per_call)


def estimate_run(
    settings: Settings, generate: GenerateOptions, answer: AnswerOptions, judge: JudgeOptions
) -> list[Estimate]:
    """Every stage of `run`; answer and judge on stand-ins for texts that do not exist yet."""
    first = estimate_generate(settings, generate)
    collection = open_collection(generate.store)
    try:
        chunks = islice(iter_chunks(collection, generate.doc_key), generate.limit)
        texts = {chunk.id: chunk.text for chunk in chunks if chunk.text.strip()}
    finally:
        release(generate.store)
    half = _filler(OUTPUT_TOKENS["generate"] / 2)
    model = settings.model_for("answer")
    prompt = load_prompt("answer", settings.prompts_dir)
    done, _ = done_rows(answer.out / ANSWERS_FILE, model, prompt.hash)
    questions = [Question(qa_id_for(chunk_id), chunk_id, half) for chunk_id in texts]
    pending = [question for question in questions if question.qa_id not in done]
    prompts = (
        prompt.template.format_messages(
            **prompt.fill(question=q.text, context=context_block([texts[q.chunk_id]] * answer.k))
        )
        for q in pending
    )
    second = estimate("answer", model, len(pending), prompts, settings)
    if answer.rag is not None:
        second = Estimate("answer", f"rag:{answer.rag}", len(questions), 0, 0, 0, None)
    reply = _filler(OUTPUT_TOKENS["answer"])
    exams = [Exam(q.qa_id, half, half, reply) for q in questions]
    return [first, second, _judge(settings, judge, exams)]


def _filler(tokens: float) -> str:
    """A stand-in text that the estimate counts as about `tokens` tokens."""
    return " ".join(["tok"] * max(1, round(tokens / text_tokens("tok "))))
