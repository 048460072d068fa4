"""--dry-run: what a stage would call and cost, from its rendered prompts, calling nothing.

The rows to do are those a real run would do after resuming. Calls are counted as a run
without failures makes them. Input tokens are estimated from each rendered prompt; output
tokens from the rows already done, when there are some, else from OUTPUT_TOKENS. `run`
estimates answer and judge before their inputs exist, from stand-in texts of those sizes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from ragexam.analysis.controls import build_controls
from ragexam.analysis.keypoints import dump
from ragexam.config import AnswerContext, Scale, Settings
from ragexam.io.batchfiles import parse_custom_id, scan_results
from ragexam.io.cells import MULTI_HOP, SINGLE, UNANSWERABLE
from ragexam.io.csvfile import read_columns, read_rows
from ragexam.io.fingerprint import changed_inputs, stale_rows
from ragexam.io.ledger import Ledger
from ragexam.io.runfolder import CONTROL_RUNS, RunFolder
from ragexam.llm.pacing import estimate_tokens, text_tokens
from ragexam.llm.prices import batch_price, price_of
from ragexam.llm.prompts import Prompt, context_block, load_prompt
from ragexam.options import DEFAULT_K, Given
from ragexam.rag.base import Question
from ragexam.rag.embedders import CollectionEmbedder
from ragexam.rag.given import PROMPTS
from ragexam.stages.answer import embeds_questions, needs_store, read_questions
from ragexam.stages.exams import Exam, Exams, load_exams, read_exams
from ragexam.stages.exams import inputs as exam_inputs
from ragexam.stages.generate import GeneratePlan, qa_id_for
from ragexam.stages.harder import harder_held
from ragexam.stages.judge import ControlPlan, JudgePlan, sources_of
from ragexam.stages.keypoints import KeyPointsPlan
from ragexam.stages.replay import outstanding
from ragexam.stages.session import Session
from ragexam.stages.setup import store_ref
from ragexam.store.chroma import get_chunks, iter_chunks, open_collection, release

# Tokens per reply when no earlier row says: a question and its answer; an answer; a grade.
OUTPUT_TOKENS = {
    "generate": 90,
    "answer": 150,
    "judge": 80,
    "judge_controls": 80,
    "key_points": 40,
    "judge_key_points": 200,  # a verdict, with evidence, per key point and per statement
}
STAND_IN_POINTS = 3  # key points of a question not written yet
READS = {MULTI_HOP: OUTPUT_TOKENS["judge_key_points"], UNANSWERABLE: OUTPUT_TOKENS["judge"]}
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
    batch_cost_usd: float | None = None  # the same calls through a Batch API
    batched: bool = False  # --batch or --batch-dir: the batch price is the one that applies
    out: int = 0  # rows whose requests are out in batches: paid for, not counted here

    @property
    def priced(self) -> float | None:
        """The cost at the rate that applies: the batch price when batched."""
        return self.batch_cost_usd if self.batched else self.cost_usd

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
    out: int = 0,
) -> Estimate:
    """Count the calls and tokens of these prompts, and price them (`out`: the rows left out,
    whose requests are out in batches)."""
    calls, tokens = 0, 0
    for messages in prompts:
        calls += 1
        tokens += estimate_tokens(messages)
    output = round(calls * (OUTPUT_TOKENS[stage] if per_call is None else per_call))
    price, batch = price_of(model, settings), batch_price(model, settings)
    cost = price.cost(tokens, output) if price else None
    batch_cost = batch.cost(tokens, output) if batch else None
    return Estimate(stage, model, rows, calls, tokens, output, cost, batch_cost, out=out)


def done_rows(
    path: Path,
    model: str,
    prompt_hash: str,
    key: str = "qa_id",
    inputs: Callable[[], Mapping[str, str]] | None = None,
) -> tuple[set[str], float | None]:
    """The rows a real run would skip (`ok`, this model and prompt, and with `inputs`, made
    from the input this run has for them), and their output per call."""
    if not path.exists():
        return set(), None
    rows = [
        row
        for row in _ok_rows(path, key)
        if (row.get("model"), row.get("prompt_hash")) == (model, prompt_hash)
    ]
    return _done(_current(rows, key, inputs), key)


def _current(
    rows: list[dict[str, str]], key: str, inputs: Callable[[], Mapping[str, str]] | None
) -> list[dict[str, str]]:
    """The rows whose input has not changed since they were made: the others are redone."""
    if inputs is None or not rows:
        return rows
    changed = set(changed_inputs({row[key]: row for row in rows}, inputs))
    return [row for row in rows if row[key] not in changed]


def _ok_rows(path: Path, key: str, fixed: Iterable[str] = ()) -> list[dict[str, str]]:
    """An output's `ok` rows, holding only the cells an estimate reads: their fingerprint and
    cost (a million rows' answers and reasonings are never held)."""
    read = ("model", "prompt_hash", "input_hash", "attempts", "completion_tokens", *fixed)
    columns = read_columns(path, [key, "status"], optional=read)
    names, found = list(columns), []
    for cells in zip(*columns.values(), strict=True):
        row = dict(zip(names, cells, strict=True))
        if row["status"] == "ok":
            found.append(row)
    return found


def out_in_batches(
    folder: RunFolder, stage: str, done: set[str], api: bool = False
) -> tuple[set[str], int]:
    """`done`, and the rows whose requests are out in batches, or whose results are on disk
    and not merged yet (paid for: the batch road merges them and sends nothing for them), and
    how many those are. Requests never sent (not uploaded, or refused) are out only for the
    Batch API's road (`api`), which sends them; another road drops them and does their rows."""
    ledger = Ledger(folder.batch_ledger(stage), folder.batch_tag(stage))
    shards = [shard for shard in ledger.waiting() if api or shard.sent]
    out = set(outstanding(ledger, shards))  # the keys of the shards still waiting
    for path in ledger.held():  # results paid for, on disk: merged by the next run
        for identifier, _, _ in scan_results(path):
            parsed = parse_custom_id(identifier)
            if parsed is not None and parsed[0] == ledger.tag:
                out.add(parsed[3])
    out -= done
    return done | out, len(out)


def _done(rows: list[dict[str, str]], key: str) -> tuple[set[str], float | None]:
    """The keys of these done rows, and their output tokens per call."""
    calls = sum(int(row.get("attempts") or 0) for row in rows)
    output = sum(int(row.get("completion_tokens") or 0) for row in rows)
    return {row[key] for row in rows}, (output / calls if calls else None)


def estimate_generate(settings: Settings, given: Given, session: Session) -> list[Estimate]:
    """generate: one call per chunk still to do, except empty chunks; then the harder
    questions still wanted (harder_estimates)."""
    return _generated(settings, given, session)[0]


def _generated(
    settings: Settings, given: Given, session: Session
) -> tuple[list[Estimate], set[str]]:
    """generate's estimates, and the questions of the folder's exam it keeps as they are."""
    store = store_ref(given, settings, session)
    plan = GeneratePlan(settings, given, store, open_collection(store), session)
    try:
        done, per_call = done_rows(
            RunFolder(given.out).qa_dataset, plan.llm.model, plan.prompt.hash, inputs=plan.inputs
        )
        done, out = out_in_batches(RunFolder(given.out), "generate", done, given.calls.batch)
        rows, tasks = plan.single_tasks(done)
        asked = [task for task in tasks if str(task.payload).strip()]
        prompts = [plan.messages(task) for task in asked]
        if plan.critic is not None:  # --check: one critic call per question written
            half = _filler(OUTPUT_TOKENS["generate"] / 2)
            values = (
                plan.critic.fill(chunk=task.payload, question=half, answer=half) for task in asked
            )
            prompts += [plan.critic.template.format_messages(**value) for value in values]
        single = estimate("generate", plan.llm.model, rows, prompts, settings, per_call, out)
        return [single, *harder_estimates(plan, done, settings)], done
    finally:
        release(store)


def harder_estimates(plan: GeneratePlan, done: set[str], settings: Settings) -> list[Estimate]:
    """Per harder kind still wanted: its writing and every check of each question, as if each
    candidate were kept at its first try (a dropped one costs fewer checks, and a write more)."""
    if plan.harder is None:
        return []
    path = RunFolder(plan.out).qa_dataset
    rows = read_rows(path, ["qa_id"]) if path.exists() else []
    plan.harder.start(Counter(row.get("kind") or SINGLE for row in rows if row["qa_id"] in done))
    filler, found = _filler(OUTPUT_TOKENS["generate"] / 2), []
    verifier = plan.harder.verifier
    for kind, item in plan.harder.asked.items():
        picked = item.candidates[: item.quota.wanted]
        checks = [plan.harder.checks(candidate, filler) for candidate in picked]
        answerer = [prompt for check in checks for prompt in check.answerer]
        judge = [prompt for check in checks for prompt in check.judge]
        parts = [
            estimate(
                "generate", plan.llm.model, len(picked), map(plan.harder.messages, picked), settings
            ),
            estimate("answer", verifier.answerer.model, 0, answerer, settings),
            # a multi-hop check's judge marks key points; an unanswerable one's quotes a line
            estimate("judge", verifier.judge.model, 0, judge, settings, READS[kind]),
        ]
        costs = [part.cost_usd for part in parts]
        found.append(
            Estimate(
                f"generate {kind}",
                plan.llm.model,
                len(picked),
                sum(part.calls for part in parts),
                sum(part.input_tokens for part in parts),
                sum(part.output_tokens for part in parts),
                None if None in costs else sum(cost or 0.0 for cost in costs),
            )
        )
    return found


def estimate_answer(settings: Settings, given: Given, session: Session) -> Estimate:
    """answer: one call per question still to do, with k chunks of its source's size."""
    exam = given.inputs.qa_dataset or RunFolder(given.out).qa_dataset
    questions, _ = read_questions(exam)
    questions = questions[: given.calls.limit]
    if given.answering.rag is not None:  # ragexam itself calls nothing
        return Estimate("answer", f"rag:{given.answering.rag}", len(questions), 0, 0, 0, None)
    store = store_ref(given, settings, session) if needs_store(given) else None
    collection = open_collection(store) if store is not None else None
    try:
        _refused_embedding(settings, given, collection)
        return _answers(settings, given, questions, collection)
    finally:
        release(store)


def _refused_embedding(settings: Settings, given: Given, collection: Any) -> None:
    """Raise what the built-in answerer's question embedding would refuse, found without a
    call: a collection with no embedding function stored, one that cannot be made (a key
    variable unset), or one whose endpoint would get a key it may not. The command itself
    refuses these before its first call; its dry run says so too, not an estimate."""
    if collection is not None and embeds_questions(given) and settings.embedding == "collection":
        CollectionEmbedder(collection, settings, given.store.trust_store_endpoint)


def _answered(
    settings: Settings, given: Given, questions: list[Question]
) -> tuple[set[str], float | None, Prompt]:
    """The answers the folder holds that `answer` keeps (made from the question as it is, by
    this model and prompt, or --rag system), their output per call, and the prompt, in the
    options' context."""
    model, context, rag = settings.model_for("answer"), given.answering.context, given.answering.rag
    prompt = load_prompt(PROMPTS.get(context, "answer"), settings.prompts_dir)
    done, per_call = done_rows(
        RunFolder(given.out).answers,
        f"rag:{rag}" if rag else model,  # a --rag system's answers: its name, no prompt
        "" if rag else prompt.hash,
        inputs=lambda: {question.qa_id: question.input_hash for question in questions},
    )
    return done, per_call, prompt


def _answers(
    settings: Settings,
    given: Given,
    questions: list[Question],
    collection: Any,
    answered: tuple[set[str], float | None, Prompt] | None = None,
) -> Estimate:
    """The answer prompts of the questions not answered yet, in the options' context: an
    answer made from another version of its question is redone (`answered`: _answered's,
    when the caller has it already)."""
    model, context = settings.model_for("answer"), given.answering.context
    done, per_call, prompt = answered or _answered(settings, given, questions)
    done, out = out_in_batches(RunFolder(given.out), "answer", done, given.calls.batch)
    pending = [question for question in questions if question.qa_id not in done]
    k = given.answering.k or DEFAULT_K
    copies = {AnswerContext.retrieved: k, AnswerContext.gold: 1}.get(context, 0)
    texts = list(_sources(collection, pending)) if copies else [""] * len(pending)

    def messages(question: Question, text: str) -> list[BaseMessage]:
        values: dict[str, str] = {"question": question.text}
        if copies:
            values["context"] = context_block([text] * copies)
        return prompt.template.format_messages(**prompt.fill(**values))

    prompts = (messages(q, t) for q, t in zip(pending, texts, strict=True) if q.text.strip())
    return estimate("answer", model, len(pending), prompts, settings, per_call, out)


def _sources(collection: Any, questions: list[Question]) -> Iterator[str]:
    """The text of each question's source chunk (empty when the store lacks it)."""
    for start in range(0, len(questions), BATCH):
        batch = questions[start : start + BATCH]
        texts = get_chunks(collection, [question.chunk_id for question in batch])
        yield from (texts.get(question.chunk_id, "") for question in batch)


def estimate_judge(settings: Settings, given: Given, session: Session) -> list[Estimate]:
    """judge: the key points an exam lacks, then `samples` calls per answer still to grade,
    then per control."""
    exams = load_exams(given)
    written = []
    if exams.scale is Scale.key_points and exams.lacking:
        plan = KeyPointsPlan(settings, exams.lacking, session)
        done, per_call = done_rows(
            RunFolder(given.out).key_points, plan.llm.model, plan.prompt.hash
        )
        done, out = out_in_batches(RunFolder(given.out), "key_points", done, given.calls.batch)
        rows, tasks = plan.tasks(done)
        prompts = (plan.prompt.template.format_messages(**plan.prompt.fill(
            question=task.payload.question, ground_truth=task.payload.ground_truth
        )) for task in tasks)  # fmt: skip
        written = [estimate("key_points", plan.llm.model, rows, prompts, settings, per_call, out)]
    return [*written, *_judge(settings, given, stand_ins(exams), session)]


def stand_ins(exams: Exams) -> Exams:
    """The exams, with stand-in key points where none are written yet."""
    points = dump([_filler(5)] * STAND_IN_POINTS)
    filled = [e if e.key_points else e._replace(key_points=points) for e in exams.exams]
    return replace(exams, exams=filled)


def _judge(settings: Settings, given: Given, exams: Exams, session: Session) -> list[Estimate]:
    folder = RunFolder(given.out)
    plan = JudgePlan(settings, given, exams.exams, session, exams.scale)
    graded = [_graded(plan, folder.judgments, "qa_id", "judge", settings, given)]
    if not given.grading.controls:
        return graded
    controls = build_controls(
        sources_of(exams.exams, exams.scale), given.grading.controls, given.folder.seed, exams.scale
    )
    plan = ControlPlan(settings, given, controls, session, exams.scale)
    controlled = _graded(plan, folder.controls, "control_id", "judge_controls", settings, given)
    return [*graded, controlled]


def graded_rows(
    plan: JudgePlan, path: Path, key: str, name: str, force: bool
) -> tuple[set[str], float | None]:
    """The grades a real run would keep: `ok`, of this model, prompt, scale, samples and
    temperature; other grades are refused as the real run refuses them, or redone with force."""
    if not path.exists():
        return set(), None
    stage = plan.stage(name, path, key, ())
    ok = {row[key]: row for row in _ok_rows(path, key, stage.fixed)}
    stale = set(stale_rows(stage, ok, force))
    kept = [row for done, row in ok.items() if done not in stale]
    return _done(_current(kept, key, plan.inputs), key)


def _graded(
    plan: JudgePlan, path: Path, key: str, stage: str, settings: Settings, given: Given
) -> Estimate:
    """`samples` calls for each task of a judge plan not done yet."""
    done, per_call = graded_rows(plan, path, key, stage, given.calls.force)
    done, out = out_in_batches(RunFolder(path.parent), stage, done, given.calls.batch)
    rows, tasks = plan.tasks(done)
    graded = [task.payload for task in tasks if task.payload.question is not None]
    prompts = (plan.messages(exam) for exam in graded for _ in range(plan.samples))
    if per_call is None and plan.scale is Scale.key_points:
        per_call = OUTPUT_TOKENS["judge_key_points"]
    return estimate(stage, plan.llm.model, rows, prompts, settings, per_call, out)


def estimate_run(settings: Settings, given: Given, session: Session) -> list[Estimate]:
    """Every stage of `run`; answer and judge on stand-ins for texts that do not exist yet
    (with --qa-dataset, no generate, and the answers to that exam's questions)."""
    given_exam = given.inputs.qa_dataset
    written, kept_questions = ([], set()) if given_exam else _generated(settings, given, session)
    store = store_ref(given, settings, session)
    collection = open_collection(store)
    try:
        _refused_embedding(settings, given, collection)
        chunks = islice(iter_chunks(collection, given.exam.doc_key), given.calls.limit)
        kept = [chunk for chunk in chunks if chunk.text.strip()]
        half = _filler(OUTPUT_TOKENS["generate"] / 2)
        questions = [Question(qa_id_for(chunk.id), chunk.id, half) for chunk in kept]
        if given_exam:
            questions = read_questions(given_exam)[0][: given.calls.limit]
        else:
            questions = _held(given, questions, kept_questions)
            questions += _harder_questions(given, [chunk.id for chunk in kept], half)
        answered = _answered(settings, given, questions)
        second = _answers(settings, given, questions, collection, answered)
        if given.answering.rag is not None:
            second = Estimate("answer", f"rag:{given.answering.rag}", len(questions), 0, 0, 0, None)
        reply, documents = _filler(OUTPUT_TOKENS["answer"]), {c.id: c.document for c in kept}
        # what --with-context shows the judge: k chunks retrieved, each about the exam's own
        texts = {c.id: c.text for c in kept}
        k = given.answering.k or DEFAULT_K
        # each stand-in ground truth its own: the judge's controls pad an answer with another
        # question's, and find none among stand-ins that are all one text (2 of 8 counted)
        exams = [
            Exam(
                q.qa_id, q.text, q.ground_truth or _own(half, n), reply,
                documents.get(q.chunk_id, ""),
                context=json.dumps([texts.get(q.chunk_id or "", half)] * k),
            )
            for n, q in enumerate(questions)
        ]  # fmt: skip
        # generate writes key points: the judge grades by them unless --scale says otherwise
        scale = given.grading.scale or Scale.key_points

        def graded(where: Given, kept: set[str]) -> Exams:
            return stand_ins(Exams(_sat(where, kept, exams), 0, scale, True))

        judged = _judge(settings, given, graded(given, answered[0]), session)
        estimates = [*written, second, *judged]
        for folder, context in CONTROL_RUNS.items() if given.grading.control_runs else ():
            where = given.but(out=given.out / folder, context=context)
            there = _answered(settings, where, questions)  # the control run's own answers
            estimates.append(
                _named(_answers(settings, where, questions, collection, there), folder)
            )
            graders = where.but(controls=0, with_context=False)
            judged = _judge(settings, graders, graded(graders, there[0]), session)
            estimates += [_named(e, folder) for e in judged]
    finally:
        release(store)
    return estimates


def _held(given: Given, questions: list[Question], kept: set[str]) -> list[Question]:
    """The questions of the run's exam: those its folder holds that generate keeps, as they
    are; stand-ins for those still to write."""
    path = RunFolder(given.out).qa_dataset
    if not kept or not path.exists():
        return questions
    held = {question.qa_id: question for question in read_questions(path)[0]}
    return [held[q.qa_id] if q.qa_id in kept and q.qa_id in held else q for q in questions]


def _sat(given: Given, kept: set[str], exams: list[Exam]) -> list[Exam]:
    """What the judge of a run grades: each answer the folder holds that `answer` keeps
    (`kept`), as it is; for those still to write, the stand-ins `exams`."""
    qa_path, answers_path = exam_inputs(given)
    if not kept or not qa_path.exists() or not answers_path.exists():
        return exams
    folder = RunFolder(given.out)
    held = read_exams(qa_path, answers_path, folder.key_points, given.grading.with_context)[0]
    answered = {exam.qa_id: exam for exam in held if exam.qa_id in kept}
    return [answered.get(exam.qa_id, exam) for exam in exams]


def _harder_questions(given: Given, chunks: list[str], text: str) -> list[Question]:
    """The harder questions run's exam will hold beside one per chunk: those its folder's exam
    holds already, and stand-ins for those generate is still to write."""
    lacking, kinds = harder_held(given)
    path = RunFolder(given.out).qa_dataset
    held = [q for q in read_questions(path)[0] if q.qa_id in kinds] if kinds else []
    stand_ins = [
        Question(
            f"{kind}-{n}", chunks[n % len(chunks)] if kind == MULTI_HOP and chunks else "", text
        )
        for kind, missing in lacking.items()
        for n in range(missing)
    ]
    return held + stand_ins


def _named(estimated: Estimate, folder: str) -> Estimate:
    return replace(estimated, stage=f"{estimated.stage}_{folder}")


def _own(filler: str, n: int) -> str:
    """The filler made the n-th question's own, at about the same number of tokens."""
    return f"q{n} {filler.split(' ', 1)[1]}" if " " in filler else f"q{n}"


def _filler(tokens: float) -> str:
    """A stand-in text that the estimate counts as about `tokens` tokens."""
    return " ".join(["tok"] * max(1, round(tokens / text_tokens("tok "))))
