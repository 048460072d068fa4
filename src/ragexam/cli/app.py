"""The command line: parse options, build settings, call one core function, print the result.

Each command imports its stage when it runs, so `ragexam --help` does not load every library.
"""

from __future__ import annotations

import functools
import gc
import inspect
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperOption

from ragexam.cli.display import (
    Starting,
    cost_text,
    progress_bar,
    say,
    show_estimates,
    show_warnings,
    summary_line,
)
from ragexam.commands import CONTROL_RUNS
from ragexam.config import (
    AnswerContext,
    Scale,
    Settings,
    StructuredMethod,
    debug_enabled,
)
from ragexam.errors import ConfigError, RagexamError
from ragexam.llm.endpoint import one_check_per_run
from ragexam.store.chroma import StoreRef

if TYPE_CHECKING:
    from ragexam.stages.judge import JudgeOptions

app = typer.Typer(
    help="Evaluate a RAG system over a Chroma collection: generate, answer, judge, stats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
F = TypeVar("F", bound=Callable[..., Any])
_type_shown = TyperOption.display_type_rich


def _flag_type(option: TyperOption, ctx: Any) -> str | None:
    """No type for a flag: typer shows "--force <bool>", as if it took a value."""
    return None if option.is_flag else _type_shown(option, ctx)


TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign, assignment]


def _opt(name: str, text: str, **extra: Any) -> Any:
    return typer.Option(name, help=escape(text), **extra)  # "[json_schema]" is not rich markup


OutOpt = Annotated[Path, _opt("--out", "Run folder for every file.")]
ChromaOpt = Annotated[Path | None, _opt("--chroma", "Chroma persist directory.")]
UrlOpt = Annotated[str | None, _opt("--chroma-url", "Chroma server URL instead.")]
TenantOpt = Annotated[
    str | None, _opt("--chroma-tenant", "The server's tenant [CHROMA_TENANT, else its default].")
]
DatabaseOpt = Annotated[
    str | None,
    _opt("--chroma-database", "The server's database [CHROMA_DATABASE, else its default]."),
]
CollectionOpt = Annotated[str | None, _opt("--collection", "May be left out if only one.")]
LimitOpt = Annotated[int | None, _opt("--limit", "Only the first N rows.", min=1)]
ConcurrencyOpt = Annotated[int | None, _opt("--concurrency", "Calls in flight [16].", min=1)]
ModelOpt = Annotated[str | None, _opt("--model", "Chat model for this stage.")]
DocKeyOpt = Annotated[str | None, _opt("--doc-key", "Metadata field naming the document.")]
ErrorRateOpt = Annotated[
    float | None,
    _opt("--max-error-rate", "Exit 1 above this share of error rows [0.05].", min=0, max=1),
]
MethodOpt = Annotated[
    StructuredMethod | None,
    _opt("--structured-output", "How to ask for structured output [json_schema]."),
]
ForceOpt = Annotated[bool, _opt("--force", "Redo rows of another model or prompt.")]
KOpt = Annotated[int, _opt("--k", "Chunks to retrieve per question.", min=1)]
EmbeddingOpt = Annotated[
    str | None, _opt("--embedding", "collection (the store's own) or openai:MODEL [collection].")
]
RagOpt = Annotated[str | None, _opt("--rag", "Your RAG system as module:callable.")]
QaOpt = Annotated[Path | None, _opt("--qa-dataset", "Questions [OUT/qa_dataset.csv].")]
AnswersOpt = Annotated[Path | None, _opt("--answers", "Answers [OUT/answers.csv].")]
SamplesOpt = Annotated[int, _opt("--samples", "Grade each answer N times.", min=1)]
TemperatureOpt = Annotated[
    float | None,
    _opt("--temperature", "Judge temperature [0, or 0.7 with --samples > 1].", min=0, max=2),
]
ScaleOpt = Annotated[Scale, _opt("--scale", "unit: floats 0..1; ten: integers 0..10.")]
StatsKOpt = Annotated[int | None, _opt("--k", "Metrics cutoff [answer's k, else 5].", min=1)]
SeedOpt = Annotated[int, _opt("--seed", "Seed of the resampling.")]
MaxCharsOpt = Annotated[int, _opt("--max-chunk-chars", "Truncate longer chunks.", min=100)]
ContextOpt = Annotated[
    AnswerContext, _opt("--context", "retrieved chunks, the source chunk alone, or none.")
]
ControlsOpt = Annotated[
    bool, _opt("--controls", "Also answer and judge with gold context and closed-book.")
]
SampleOpt = Annotated[int | None, _opt("--sample", "N chunks, stratified by document.", min=1)]
PerDocumentOpt = Annotated[
    int | None, _opt("--per-document", "N chunks from every document.", min=1)
]
SampleSeedOpt = Annotated[int, _opt("--seed", "Seed of --sample and --split.")]
RunSeedOpt = Annotated[int, _opt("--seed", "Seed of --sample, --split and the resampling.")]
SplitOpt = Annotated[
    float | None, _opt("--split", "Share of each document's questions in validation.")
]
CheckOpt = Annotated[bool, _opt("--check", "One critic call per row: flag bad questions.")]
StatsSplitOpt = Annotated[str | None, _opt("--split", "Only this split, e.g. test.")]
ExcludeFlaggedOpt = Annotated[
    bool, _opt("--exclude-flagged", "Leave flagged questions out of every mean.")
]
JudgeControlsOpt = Annotated[
    int, _opt("--controls", "Grade 4 known answers to N sampled questions; 0: none.", min=0)
]
RagTimeoutOpt = Annotated[
    float | None, _opt("--rag-timeout", "Seconds per --rag call [RAGEXAM_TIMEOUT].", min=0.001)
]
TrustOpt = Annotated[
    bool, _opt("--trust-store-endpoint", "Let the store's embedding function send its key.")
]
RunJudgeControlsOpt = Annotated[  # run's --controls are the gold and closed-book runs
    int, _opt("--judge-controls", "judge's --controls: known answers to N questions.", min=0)
]
TextsOpt = Annotated[
    bool, _opt("--texts/--no-texts", "Record retrieved_texts and source_text in answers.csv.")
]
RpmOpt = Annotated[int | None, _opt("--rpm", "Pace calls to N requests a minute.", min=1)]
TpmOpt = Annotated[int | None, _opt("--tpm", "Pace calls to N tokens a minute.", min=1)]
DryRunOpt = Annotated[bool, _opt("--dry-run", "Estimate calls, tokens and cost; call nothing.")]
FailUnderOpt = Annotated[
    str | None, _opt("--fail-under", "Exit 3 if an overall figure is below: METRIC=VALUE,...")
]
RegressionOpt = Annotated[
    bool, _opt("--fail-on-regression", "Exit 3 if a metric's 95% CI is wholly below zero.")
]


def handled(command: F) -> F:
    """Turn a RagexamError into one line on stderr and its exit code; bugs keep a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        show_warnings()
        sigterm_as_interrupt()
        try:
            with one_check_per_run(), Starting.show(command.__name__):
                return command(*args, **kwargs)
        except RagexamError as exc:
            say(f"Error: {exc}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            say("Interrupted: every finished row is saved; rerun the same command to go on.")
            raise typer.Exit(130) from None
        except typer.Exit:
            raise
        except Exception as exc:
            if debug_enabled():
                raise
            last = traceback.extract_tb(exc.__traceback__)[-1]
            say(
                f"Internal error: {type(exc).__name__} at {Path(last.filename).name}:"
                f"{last.lineno}. This is a bug; RAGEXAM_DEBUG=1 shows the traceback."
            )
            raise typer.Exit(2) from None
        finally:
            gc.unfreeze()  # what `loading` froze: a caller in the same process collects it again

    return wrapper  # type: ignore[return-value]


@contextmanager
def loading() -> Iterator[None]:
    """Import a stage's libraries with the cycle collector held, then freeze what they built.

    Imports leave next to no garbage, yet the collector's full passes over what they build cost
    `judge` 0.17 s while loading and 0.08-0.11 s more before its first call. Frozen, the objects
    that live as long as the command are skipped by every later pass.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # before the collector runs again: its first pass would take them all
        if enabled:
            gc.enable()


def sigterm_as_interrupt() -> None:
    """SIGTERM (a CI job cancelled, `kill`) stops a run the way Ctrl-C does: exit 130."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_sigint)


def _as_sigint(signum: int, frame: Any) -> None:
    signal.raise_signal(signal.SIGINT)  # asyncio's own Ctrl-C handling then winds the run down


def show_cost(out: Path, stage: str, settings: Settings) -> None:
    """Price what the stage billed, record it in the manifest, and say it."""
    from ragexam.llm.prices import record_cost

    cost, price = record_cost(out, stage, settings)
    if price is None:
        say("  cost: unknown: set RAGEXAM_PRICE_INPUT and RAGEXAM_PRICE_OUTPUT (USD/1M tokens)")
    else:
        say(f"  cost: {cost_text(cost)} ({price.short()})")


def store_ref(
    chroma: Path | None,
    chroma_url: str | None,
    collection: str | None,
    timeout: float = 60.0,
    settings: Settings | None = None,
) -> StoreRef:
    """The store the options point at; exactly one of --chroma and --chroma-url."""
    from ragexam import commands

    ref = commands.store_ref(chroma, chroma_url, collection, settings, _notes.append)
    return replace(ref, timeout=timeout)


_notes: list[str] = []  # what the core asked to be told, said after the stage's bar


def _given(command: Callable[..., Any], values: dict[str, Any]) -> dict[str, Any]:
    """The command's options by name, from its `locals()`: what ragexam.commands builds from."""
    return {name: values[name] for name in inspect.signature(command).parameters}


def say_notes() -> None:
    """Say, once, what the core noted while the stage ran (e.g. a store read from a copy)."""
    while _notes:
        say(_notes.pop(0))


def _version(shown: bool) -> None:
    if shown:
        from ragexam import __version__

        print(f"ragexam {__version__}")
        raise typer.Exit()


@app.callback()
def _commands(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Show the version and exit.", callback=_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Evaluate a RAG system over a Chroma collection: generate, answer, judge, stats."""


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
    max_chunk_chars: MaxCharsOpt = 8000,
    sample: SampleOpt = None,
    per_document: PerDocumentOpt = None,
    seed: SampleSeedOpt = 0,
    split: SplitOpt = None,
    check: CheckOpt = False,
    chroma_tenant: TenantOpt = None,
    chroma_database: DatabaseOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Write one question and ground-truth answer per chunk: qa_dataset.csv."""
    with loading():
        from ragexam.commands import generate_setup
        from ragexam.stages.generate import run_generate
        from ragexam.stages.runner import check_error_rate

    settings, options = generate_setup(_given(generate, locals()), _notes.append)
    if dry_run:
        from ragexam.stages.dryrun import estimate_generate

        return show_estimates([estimate_generate(settings, options)])
    with progress_bar("generate") as bar:
        result = run_generate(settings, options, bar)
    say_notes()
    summary_line("generate", result)
    show_cost(out, "generate", settings)
    check_error_rate(result.path, settings.max_error_rate)


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
    context: ContextOpt = AnswerContext.retrieved,
    trust_store_endpoint: TrustOpt = False,
    rag_timeout: RagTimeoutOpt = None,
    texts: TextsOpt = True,
    max_chunk_chars: MaxCharsOpt = 8000,
    chroma_tenant: TenantOpt = None,
    chroma_database: DatabaseOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Have the RAG system answer every question, with the source chunk's rank: answers.csv."""
    with loading():
        from ragexam.commands import answer_setup
        from ragexam.stages.answer import run_answer
        from ragexam.stages.runner import check_error_rate

    settings, options = answer_setup(_given(answer, locals()), _notes.append)
    if dry_run:
        from ragexam.stages.dryrun import estimate_answer

        return show_estimates([estimate_answer(settings, options)])
    with progress_bar("answer") as bar:
        result = run_answer(settings, options, bar)
    note = f"{result.skipped} questions skipped: they are errors in the qa dataset"
    say_notes()
    summary_line("answer", result, note if result.skipped else None)
    show_cost(out, "answer", settings)
    check_error_rate(result.path, settings.max_error_rate)


@app.command()
@handled
def judge(
    out: OutOpt = Path("outputs"),
    qa_dataset: QaOpt = None,
    answers: AnswersOpt = None,
    samples: SamplesOpt = 1,
    temperature: TemperatureOpt = None,
    scale: ScaleOpt = Scale.unit,
    limit: LimitOpt = None,
    concurrency: ConcurrencyOpt = None,
    model: ModelOpt = None,
    max_error_rate: ErrorRateOpt = None,
    structured_output: MethodOpt = None,
    force: ForceOpt = False,
    controls: JudgeControlsOpt = 10,
    seed: Annotated[int, _opt("--seed", "Seed of the controls' sample.")] = 0,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Grade every answer against its ground truth: judgments.csv (and judge_controls.csv)."""
    with loading():
        from ragexam.commands import judge_setup
        from ragexam.stages.judge import run_judge
        from ragexam.stages.runner import check_error_rate

    settings, options = judge_setup(_given(judge, locals()))
    if dry_run:
        from ragexam.stages.dryrun import estimate_judge

        return show_estimates(estimate_judge(settings, options))
    with progress_bar("judge") as bar:
        result = run_judge(settings, options, bar)
    note = f"{result.skipped} answers skipped: they are errors in the answers file"
    summary_line("judge", result, note if result.skipped else None)
    show_cost(out, "judge", settings)
    if controls:
        _judge_controls(settings, options)
    check_error_rate(result.path, settings.max_error_rate)


_verdict_in_stats: ContextVar[bool] = ContextVar("verdict_in_stats", default=False)


@contextmanager
def _verdict_said_by_stats() -> Iterator[None]:
    """In `run`, the judge's verdict is said once, by stats, beside the scores it qualifies."""
    token = _verdict_in_stats.set(True)
    try:
        yield
    finally:
        _verdict_in_stats.reset(token)


def _judge_controls(settings: Settings, options: JudgeOptions) -> None:
    """Grade the judge's known-answer controls and say in one line how it did."""
    from ragexam.analysis.verdict import read_verdict
    from ragexam.stages.judge import run_controls
    from ragexam.stages.runner import check_error_rate

    with progress_bar("judge controls") as bar:
        result = run_controls(settings, options, bar)
    summary_line("judge controls", result)
    show_cost(options.out, "judge_controls", settings)
    verdict = read_verdict(options.out)
    if verdict is not None and not _verdict_in_stats.get():
        say(verdict.message())
    check_error_rate(result.path, settings.max_error_rate)


@app.command()
@handled
def stats(
    out: OutOpt = Path("outputs"),
    k: StatsKOpt = None,
    seed: SeedOpt = 0,
    split: StatsSplitOpt = None,
    exclude_flagged: ExcludeFlaggedOpt = False,
    fail_under: FailUnderOpt = None,
) -> None:
    """Summarise per source document: summary_by_document.csv, summary.csv, report.html."""
    from rich.console import Console

    from ragexam.analysis.gates import check_bounds, parse_bounds
    from ragexam.analysis.stats import StatsOptions, run_stats
    from ragexam.report.controlcharts import control_line
    from ragexam.report.terminal import terminal_table

    bounds = parse_bounds(fail_under) if fail_under is not None else None
    from ragexam.report.html import write_report

    result = run_stats(StatsOptions(out, k, seed, split, exclude_flagged))
    write_report(result, result.paths["report"])
    Starting.clear()  # the table goes to stdout: no transient line may be drawn over it
    Console().print(terminal_table(result))
    if line := control_line(result.overall):
        say(line)
    if result.controls is not None:
        say(result.controls.message())
    if result.stale:
        say(
            f"Warning: {result.stale} grades were made from a question or answer that has "
            "changed since; they count as pending: rerun judge"
        )
    say(f"report: {result.paths['report']}")
    if bounds:
        check_bounds({str(k): v for k, v in result.overall.iloc[0].items()}, bounds)


@app.command()
@handled
def compare(
    run_a: Annotated[Path, typer.Argument(help="The earlier run folder.")],
    run_b: Annotated[Path, typer.Argument(help="The later run folder.")],
    out: Annotated[Path | None, _opt("--out", "Where comparison.csv goes [RUN_B].")] = None,
    seed: SeedOpt = 0,
    fail_on_regression: RegressionOpt = False,
) -> None:
    """Did the change help? Paired differences per metric and document: comparison.csv."""
    from rich.console import Console

    from ragexam.analysis.compare import run_compare
    from ragexam.analysis.gates import check_regressions
    from ragexam.report.terminal import comparison_table

    result = run_compare(run_a, run_b, out or run_b, seed)
    Starting.clear()
    for warning in result.warnings:
        say(f"Warning: {warning}")
    Console().print(comparison_table(result))
    say(f"comparison: {result.path}")
    if fail_on_regression:
        check_regressions(result.table)


@app.command()
@handled
def calibrate(
    labels: Annotated[
        Path | None, typer.Argument(help="Your grades: qa_id, completeness and/or conciseness.")
    ] = None,
    out: OutOpt = Path("outputs"),
    scale: Annotated[
        Scale, _opt("--scale", "Your labels: unit (0..1) or ten (0..10).")
    ] = Scale.unit,
    template: Annotated[
        int | None, _opt("--template", "Write labels_template.csv: N questions to grade.", min=1)
    ] = None,
    seed: SeedOpt = 0,
) -> None:
    """Measure the judge against your grades: calibration.csv; or write a template to fill in."""
    from rich.console import Console

    from ragexam.analysis.calibrate import run_calibrate
    from ragexam.analysis.labels import write_template
    from ragexam.report.terminal import calibration_table

    if (labels is None) == (template is None):
        raise ConfigError("give LABELS.csv to measure the judge, or --template N to write one")
    if labels is None:
        path, count = write_template(out, template or 0, seed)
        say(
            f"labels template: {count} questions -> {path}; fill in completeness and/or "
            f"conciseness from 0 to 1, then run: ragexam calibrate {path}"
        )
        return
    result = run_calibrate(labels, out, scale, seed)
    for note in result.notes:
        say(f"Warning: {note}")
    Console().print(calibration_table(result.table))
    say(result.reading)
    say(f"calibration: {result.path}")


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
    controls: ControlsOpt = False,
    sample: SampleOpt = None,
    per_document: PerDocumentOpt = None,
    seed: RunSeedOpt = 0,
    split: SplitOpt = None,
    check: CheckOpt = False,
    trust_store_endpoint: TrustOpt = False,
    max_chunk_chars: MaxCharsOpt = 8000,
    samples: SamplesOpt = 1,
    temperature: TemperatureOpt = None,
    scale: ScaleOpt = Scale.unit,
    context: ContextOpt = AnswerContext.retrieved,
    exclude_flagged: ExcludeFlaggedOpt = False,
    texts: TextsOpt = True,
    chroma_tenant: TenantOpt = None,
    chroma_database: DatabaseOpt = None,
    judge_controls: RunJudgeControlsOpt = 10,
    rag_timeout: RagTimeoutOpt = None,
    rpm: RpmOpt = None,
    tpm: TpmOpt = None,
    dry_run: DryRunOpt = False,
    fail_under: FailUnderOpt = None,
) -> None:
    """Run every stage in order: generate, answer, judge, stats; --limit applies to each."""
    from ragexam.commands import check_run, run_setup

    given = _given(run, locals())
    check_run(given)
    if dry_run:
        from ragexam.stages.dryrun import estimate_run

        settings, first, second, third = run_setup(given, _notes.append)
        return show_estimates(estimate_run(settings, first, second, third, controls))
    # What every stage of the run shares, given once so that the control runs cannot drift.
    calls: dict[str, Any] = dict(
        limit=limit, concurrency=concurrency, model=model, max_error_rate=max_error_rate,
        force=force, rpm=rpm, tpm=tpm,
    )  # fmt: skip
    store: dict[str, Any] = dict(
        chroma=chroma, chroma_url=chroma_url, collection=collection, chroma_tenant=chroma_tenant,
        chroma_database=chroma_database, max_chunk_chars=max_chunk_chars,
    )  # fmt: skip
    reading: dict[str, Any] = dict(texts=texts, trust_store_endpoint=trust_store_endpoint)
    grading: dict[str, Any] = dict(
        samples=samples, temperature=temperature, scale=scale, structured_output=structured_output
    )
    generate(
        out=out, doc_key=doc_key, structured_output=structured_output, sample=sample,
        per_document=per_document, seed=seed, split=split, check=check, **store, **calls,
    )  # fmt: skip
    answer(
        out=out, k=k, embedding=embedding, rag=rag, context=context, rag_timeout=rag_timeout,
        **store, **reading, **calls,
    )  # fmt: skip
    with _verdict_said_by_stats():
        judge(out=out, seed=seed, controls=judge_controls, **grading, **calls)
    for folder, kind in CONTROL_RUNS.items() if controls else ():
        exam = out / "qa_dataset.csv"
        answer(out=out / folder, qa_dataset=exam, context=kind, **store, **reading, **calls)
        # the judge's known-answer controls are graded once, in the exam run
        judge(out=out / folder, qa_dataset=exam, controls=0, **grading, **calls)
    _show_run_cost(out)
    stats(out=out, k=k, seed=seed, exclude_flagged=exclude_flagged, fail_under=fail_under)


def _show_run_cost(out: Path) -> None:
    """Say what every stage of the run cost in all, the control runs' included."""
    from ragexam.cli.display import run_cost_line
    from ragexam.llm.prices import record_total

    say(run_cost_line(record_total(out)), wrap=True)


def main() -> None:
    """Entry point of `ragexam`."""
    app()


def generate_main() -> None:
    """Entry point of `ragexam-generate`."""
    typer.run(generate)


def answer_main() -> None:
    """Entry point of `ragexam-answer`."""
    typer.run(answer)


def judge_main() -> None:
    """Entry point of `ragexam-judge`."""
    typer.run(judge)


def stats_main() -> None:
    """Entry point of `ragexam-stats`."""
    typer.run(stats)


if __name__ == "__main__":  # pragma: no cover
    main()
