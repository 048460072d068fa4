"""The command line: parse options, build settings, call one core function, print the result."""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from ragexam.answer import AnswerOptions, run_answer
from ragexam.compare import comparison_table, run_compare
from ragexam.config import StructuredMethod, debug_enabled, load_settings
from ragexam.errors import RagexamError
from ragexam.generate import GenerateOptions, run_generate
from ragexam.judge import JudgeOptions, Scale, run_judge
from ragexam.report import terminal_table
from ragexam.runner import Outcome, check_error_rate
from ragexam.stats import StatsOptions, run_stats
from ragexam.store import StoreRef

app = typer.Typer(
    help="Evaluate a RAG system over a Chroma collection: generate, answer, judge, stats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

OutOpt = Annotated[Path, typer.Option("--out", help="Run folder for every file.")]
ChromaOpt = Annotated[Path | None, typer.Option("--chroma", help="Chroma persist directory.")]
UrlOpt = Annotated[str | None, typer.Option("--chroma-url", help="Chroma server URL instead.")]
CollectionOpt = Annotated[
    str | None, typer.Option("--collection", help="Collection; may be left out if only one.")
]
LimitOpt = Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N rows.")]
ConcurrencyOpt = Annotated[
    int | None,
    typer.Option("--concurrency", min=1, help="LLM calls in flight at once [default: 16]."),
]
ModelOpt = Annotated[str | None, typer.Option("--model", help="Chat model for this stage.")]
DocKeyOpt = Annotated[
    str | None, typer.Option("--doc-key", help="Metadata field naming a chunk's source document.")
]
ErrorRateOpt = Annotated[
    float | None,
    typer.Option(
        "--max-error-rate", min=0, max=1, help="Exit 1 above this share of error rows [0.05]."
    ),
]
MethodOpt = Annotated[
    StructuredMethod | None,
    typer.Option("--structured-output", help="How to ask for structured output [json_schema]."),
]
ForceOpt = Annotated[
    bool,
    typer.Option("--force", help="Redo rows made by another model or prompt instead of refusing."),
]


@app.callback()
def _commands() -> None:
    """Evaluate a RAG system over a Chroma collection: generate, answer, judge, stats."""


def handled(command: F) -> F:
    """Turn a RagexamError into one line on stderr and exit 1; bugs keep a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except RagexamError as exc:
            err.print(f"Error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except (typer.Exit, KeyboardInterrupt):
            raise
        except Exception as exc:
            if debug_enabled():
                raise
            last = traceback.extract_tb(exc.__traceback__)[-1]
            err.print(
                f"Internal error: {type(exc).__name__} at {Path(last.filename).name}:"
                f"{last.lineno}. This is a bug; RAGEXAM_DEBUG=1 shows the traceback.",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


class BarProgress:
    """A rich progress bar on stderr: rows done, errors, rows per second.

    It appears only when the run starts, so a fail-fast error stays one line.
    """

    def __init__(self, label: str) -> None:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[errors]} errors"),
            RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.bar = Progress(*columns, console=err)
        self.label, self.errors, self.started = label, 0, False
        self.task = self.bar.add_task(label, errors=0, start=False)

    def start(self, total: int | None, done_before: int) -> None:
        """Show the bar; rows already done are mentioned, not counted."""
        note = f"{self.label} ({done_before} already done)" if done_before else self.label
        self.bar.update(self.task, total=total, description=note)
        self.bar.start_task(self.task)
        self.bar.start()
        self.started = True

    def advance(self, ok: bool) -> None:
        """One more row."""
        self.errors += not ok
        self.bar.update(self.task, advance=1, errors=self.errors)


class RateColumn(ProgressColumn):
    """Rows per second, once there is a speed to show."""

    def render(self, task: Task) -> Text:
        """The current speed."""
        return Text(f"{task.speed:.1f} rows/s" if task.speed else "- rows/s")


@contextmanager
def progress_bar(label: str) -> Iterator[BarProgress]:
    """A bar that lives while one stage runs."""
    progress = BarProgress(label)
    try:
        yield progress
    finally:
        if progress.started:  # stopping a bar that never started prints a blank line
            progress.bar.stop()


def report(stage: str, outcome: Outcome, path: Path) -> None:
    """One closing line: what was done, at what speed and token cost, and where it is."""
    rate = (outcome.ok + outcome.errors) / outcome.seconds if outcome.seconds else 0.0
    err.print(
        f"{stage}: {outcome.ok} ok, {outcome.errors} errors this run "
        f"({outcome.done_before} done before) in {outcome.seconds:.1f}s, {rate:.1f} rows/s; "
        f"tokens {outcome.prompt_tokens:,} in + {outcome.completion_tokens:,} out -> {path}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for reason, count in sorted(outcome.reasons.items(), key=lambda item: -item[1])[:3]:
        err.print(f"  {count} x {reason}", markup=False, highlight=False, soft_wrap=True)


def store_ref(chroma: Path | None, chroma_url: str | None, collection: str | None) -> StoreRef:
    """The store the options point at; one of --chroma and --chroma-url is needed."""
    if (chroma is None) == (chroma_url is None):
        raise typer.BadParameter("give exactly one of --chroma PATH and --chroma-url URL")
    return StoreRef(path=chroma, url=chroma_url, collection=collection)


@app.command()
@handled
def generate(
    chroma: ChromaOpt = None,
    chroma_url: UrlOpt = None,
    collection: CollectionOpt = None,
    out: OutOpt = Path("outputs"),
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = None,
    model: ModelOpt = None,
    doc_key: DocKeyOpt = None,
    max_error_rate: ErrorRateOpt = None,
    structured_output: MethodOpt = None,
    force: ForceOpt = False,
    max_chunk_chars: Annotated[
        int, typer.Option(min=100, help="Longer chunks are truncated, and the row says so.")
    ] = 8000,
) -> None:
    """Write one question and ground-truth answer per chunk: qa_dataset.csv."""
    settings = load_settings(
        generate_model=model,
        concurrency=concurrency,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
    )
    options = GenerateOptions(
        store_ref(chroma, chroma_url, collection), out, limit, doc_key, max_chunk_chars, force
    )
    with progress_bar("generate") as bar:
        outcome, path = run_generate(settings, options, bar)
    report("generate", outcome, path)
    check_error_rate(path, settings.max_error_rate)


KOpt = Annotated[int, typer.Option("--k", min=1, help="Chunks to retrieve per question.")]
EmbeddingOpt = Annotated[
    str | None,
    typer.Option("--embedding", help="collection (the store's own) or openai:MODEL [collection]."),
]
RagOpt = Annotated[
    str | None,
    typer.Option(
        "--rag", help="Your RAG system as module:callable, instead of the built-in chain."
    ),
]
QaOpt = Annotated[
    Path | None, typer.Option("--qa-dataset", help="Questions to answer [OUT/qa_dataset.csv].")
]


@app.command()
@handled
def answer(
    chroma: ChromaOpt = None,
    chroma_url: UrlOpt = None,
    collection: CollectionOpt = None,
    out: OutOpt = Path("outputs"),
    qa_dataset: QaOpt = None,
    k: KOpt = 5,
    embedding: EmbeddingOpt = None,
    rag: RagOpt = None,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = None,
    model: ModelOpt = None,
    max_error_rate: ErrorRateOpt = None,
    force: ForceOpt = False,
) -> None:
    """Have the RAG system answer every question, with the source chunk's rank: answers.csv."""
    settings = load_settings(
        answer_model=model,
        concurrency=concurrency,
        embedding=embedding,
        max_error_rate=max_error_rate,
    )
    store = (
        None if rag and not (chroma or chroma_url) else store_ref(chroma, chroma_url, collection)
    )
    options = AnswerOptions(store, out, qa_dataset, k, limit, rag, force)
    with progress_bar("answer") as bar:
        result = run_answer(settings, options, bar)
    report("answer", result.outcome, result.path)
    if result.skipped:
        err.print(
            f"  {result.skipped} questions skipped: they are errors in the qa dataset",
            markup=False,
            highlight=False,
        )
    check_error_rate(result.path, settings.max_error_rate)


SamplesOpt = Annotated[
    int,
    typer.Option(
        "--samples", min=1, help="Grade each answer N times; record mean, std and valid samples."
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature", min=0, max=2, help="Judge temperature [0, or 0.7 with --samples > 1]."
    ),
]
ScaleOpt = Annotated[
    Scale,
    typer.Option("--scale", help="unit: floats 0..1; ten: integers 0..10, stored divided by 10."),
]


@app.command()
@handled
def judge(
    out: OutOpt = Path("outputs"),
    qa_dataset: QaOpt = None,
    answers: Annotated[
        Path | None, typer.Option("--answers", help="Answers to grade [OUT/answers.csv].")
    ] = None,
    samples: SamplesOpt = 1,
    temperature: TemperatureOpt = None,
    scale: ScaleOpt = Scale.unit,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = None,
    model: ModelOpt = None,
    max_error_rate: ErrorRateOpt = None,
    structured_output: MethodOpt = None,
    force: ForceOpt = False,
) -> None:
    """Grade every answer against its ground truth: judgments.csv."""
    settings = load_settings(
        judge_model=model,
        concurrency=concurrency,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
    )
    options = JudgeOptions(out, qa_dataset, answers, limit, samples, temperature, scale, force)
    with progress_bar("judge") as bar:
        result = run_judge(settings, options, bar)
    report("judge", result.outcome, result.path)
    if result.skipped:
        err.print(
            f"  {result.skipped} answers skipped: they are errors in the answers file",
            markup=False,
            highlight=False,
        )
    check_error_rate(result.path, settings.max_error_rate)


@app.command()
@handled
def stats(
    out: OutOpt = Path("outputs"),
    k: Annotated[
        int | None,
        typer.Option("--k", min=1, help="Metrics cutoff [the k answer recorded, else 5]."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
) -> None:
    """Summarise per source document: summary_by_document.csv, summary.csv, report.html."""
    result = run_stats(StatsOptions(out, k, seed))
    Console().print(terminal_table(result))
    err.print(f"report: {result.paths['report']}", markup=False, highlight=False, soft_wrap=True)


@app.command()
@handled
def compare(
    run_a: Annotated[Path, typer.Argument(help="The earlier run folder.")],
    run_b: Annotated[Path, typer.Argument(help="The later run folder.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Where comparison.csv goes [RUN_B].")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the resampling.")] = 0,
) -> None:
    """Did the change help? Paired differences per metric and document: comparison.csv."""
    result = run_compare(run_a, run_b, out or run_b, seed)
    for warning in result.warnings:
        err.print(f"Warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    Console().print(comparison_table(result))
    err.print(f"comparison: {result.path}", markup=False, highlight=False, soft_wrap=True)


@app.command()
@handled
def run(
    chroma: ChromaOpt = None,
    chroma_url: UrlOpt = None,
    collection: CollectionOpt = None,
    out: OutOpt = Path("outputs"),
    k: KOpt = 5,
    embedding: EmbeddingOpt = None,
    rag: RagOpt = None,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = None,
    model: ModelOpt = None,
    doc_key: DocKeyOpt = None,
    max_error_rate: ErrorRateOpt = None,
    structured_output: MethodOpt = None,
    force: ForceOpt = False,
) -> None:
    """Run every stage in order: generate, answer, judge, stats."""
    generate(
        chroma=chroma,
        chroma_url=chroma_url,
        collection=collection,
        out=out,
        limit=limit,
        concurrency=concurrency,
        model=model,
        doc_key=doc_key,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
        force=force,
    )
    answer(
        chroma=chroma,
        chroma_url=chroma_url,
        collection=collection,
        out=out,
        k=k,
        embedding=embedding,
        rag=rag,
        concurrency=concurrency,
        model=model,
        max_error_rate=max_error_rate,
        force=force,
    )
    judge(
        out=out,
        concurrency=concurrency,
        model=model,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
        force=force,
    )
    stats(out=out, k=k)


def main() -> None:
    """Entry point of `ragexam`."""
    app()


def generate_main() -> None:
    """Entry point of `ragexam-generate`."""
    typer.run(generate)


def judge_main() -> None:
    """Entry point of `ragexam-judge`."""
    typer.run(judge)


def stats_main() -> None:
    """Entry point of `ragexam-stats`."""
    typer.run(stats)


def answer_main() -> None:
    """Entry point of `ragexam-answer`."""
    typer.run(answer)


if __name__ == "__main__":  # pragma: no cover
    main()
