"""The Python API: each command as a function that takes the CLI's options as keyword arguments.

    import ragexam
    exam = ragexam.generate(chroma="examples/chroma", limit=20)
    answers = ragexam.answer(chroma="examples/chroma", rag=my_chain)  # a callable or Runnable
    ragexam.judge()
    report = ragexam.stats()
    report.frame()  # summary_by_document.csv as a DataFrame

Each returns a `Result`: the files written, the figures, and `.frame()`. They run no progress bar
and print nothing. Inside a running event loop (Jupyter), a stage runs in a worker thread with
its own loop, so the call still simply returns its result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ragexam.config import AnswerContext, Scale, Settings, StructuredMethod, load_settings
from ragexam.store import StoreRef

if TYPE_CHECKING:
    import pandas as pd

    from ragexam.runner import StageResult

T = TypeVar("T")
PathLike = str | Path


@dataclass(frozen=True)
class Result:
    """What a command wrote (`paths`, by name), its figures, and `.frame()` to load a CSV."""

    paths: dict[str, Path]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The main file written (the first of `paths`)."""
        return next(iter(self.paths.values()))

    def frame(self, name: str | None = None) -> pd.DataFrame:
        """A CSV written, as a pandas DataFrame; the main one unless `name` says which."""
        import pandas as pd

        path = self.paths[name] if name else self.path
        frame = pd.read_csv(path, encoding="utf-8-sig")
        for column in frame.columns:
            if not pd.api.types.is_numeric_dtype(frame[column]):
                frame[column] = frame[column].map(_unescape)
        return frame


def _unescape(value: Any) -> Any:
    from ragexam.csvfile import unescape_cell

    return unescape_cell(value) if isinstance(value, str) else value


def _in_own_loop(call: Callable[[], T]) -> T:
    """Run `call` here, or in a worker thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ragexam") as pool:
        return pool.submit(call).result()


def _store(
    chroma: PathLike | None, chroma_url: str | None, collection: str | None, settings: Settings
) -> StoreRef:
    from ragexam.cli import store_ref

    path = Path(chroma) if chroma is not None else None
    return store_ref(path, chroma_url, collection, settings.store_timeout, settings)


def _stage(result: StageResult, name: str, limit: float) -> Result:
    from ragexam.runner import check_error_rate

    check_error_rate(result.path, limit)
    figures = {**result.outcome.record(), "skipped": result.skipped}
    return Result({name: result.path}, figures)


def generate(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    doc_key: str | None = None,
    max_error_rate: float | None = None,
    structured_output: StructuredMethod | str | None = None,
    force: bool = False,
    max_chunk_chars: int = 8000,
    chroma_tenant: str | None = None,
    chroma_database: str | None = None,
    sample: int | None = None,
    per_document: int | None = None,
    seed: int = 0,
    split: float | None = None,
    check: bool = False,
) -> Result:
    """Write qa_dataset.csv: one question and ground-truth answer per chunk."""
    from ragexam.generate import GenerateOptions, run_generate
    from ragexam.sampling import Sampling

    settings = load_settings(
        generate_model=model,
        concurrency=concurrency,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
        chroma_tenant=chroma_tenant,
        chroma_database=chroma_database,
    )
    store = _store(chroma, chroma_url, collection, settings)
    sampling = Sampling(sample, per_document, seed, split)
    options = GenerateOptions(
        store, Path(out), limit, doc_key, max_chunk_chars, force, sampling, check
    )
    result = _in_own_loop(lambda: run_generate(settings, options))
    return _stage(result, "qa_dataset", settings.max_error_rate)


def answer(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    qa_dataset: PathLike | None = None,
    k: int = 5,
    embedding: str | None = None,
    rag: Any = None,
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    force: bool = False,
    context: AnswerContext | str = AnswerContext.retrieved,
    trust_store_endpoint: bool = False,
    rag_timeout: float | None = None,
    texts: bool = True,
    max_chunk_chars: int = 8000,
    chroma_tenant: str | None = None,
    chroma_database: str | None = None,
) -> Result:
    """Write answers.csv; `rag` is "module:callable", or a callable or Runnable object."""
    from ragexam.answer import AnswerOptions, run_answer

    settings = load_settings(
        answer_model=model,
        concurrency=concurrency,
        embedding=embedding,
        max_error_rate=max_error_rate,
        chroma_tenant=chroma_tenant,
        chroma_database=chroma_database,
    )
    has_store = chroma is not None or chroma_url is not None
    needs_store = rag is None and AnswerContext(context) != AnswerContext.none
    store = _store(chroma, chroma_url, collection, settings) if has_store or needs_store else None
    qa = Path(qa_dataset) if qa_dataset is not None else None
    options = AnswerOptions(
        store,
        Path(out),
        qa,
        k,
        limit,
        rag,
        force,
        AnswerContext(context),
        trust_store_endpoint=trust_store_endpoint,
        rag_timeout=rag_timeout,
        max_chunk_chars=max_chunk_chars,
        texts=texts,
    )
    result = _in_own_loop(lambda: run_answer(settings, options))
    return _stage(result, "answers", settings.max_error_rate)


def judge(
    *,
    out: PathLike = "outputs",
    qa_dataset: PathLike | None = None,
    answers: PathLike | None = None,
    samples: int = 1,
    temperature: float | None = None,
    scale: Scale | str = Scale.unit,
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    structured_output: StructuredMethod | str | None = None,
    force: bool = False,
    controls: int = 10,
    seed: int = 0,
) -> Result:
    """Write judgments.csv, and judge_controls.csv unless `controls=0`."""
    from ragexam.judge import JudgeOptions, run_controls, run_judge

    settings = load_settings(
        judge_model=model,
        concurrency=concurrency,
        max_error_rate=max_error_rate,
        structured_output=structured_output,
    )
    options = JudgeOptions(
        Path(out),
        Path(qa_dataset) if qa_dataset is not None else None,
        Path(answers) if answers is not None else None,
        limit,
        samples,
        temperature,
        Scale(scale),
        force,
        controls,
        seed,
    )
    result = _in_own_loop(lambda: run_judge(settings, options))
    if not controls:
        return _stage(result, "judgments", settings.max_error_rate)
    rate = settings.max_error_rate
    checks = _stage(_in_own_loop(lambda: run_controls(settings, options)), "controls", rate)
    graded = _stage(result, "judgments", settings.max_error_rate)
    return Result({**graded.paths, **checks.paths}, {**graded.figures, "controls": checks.figures})


def stats(
    *,
    out: PathLike = "outputs",
    k: int | None = None,
    seed: int = 0,
    split: str | None = None,
    exclude_flagged: bool = False,
) -> Result:
    """Write the summaries and report.html; figures are the overall row (`document` ALL)."""
    from ragexam.stats import StatsOptions, run_stats

    result = run_stats(StatsOptions(Path(out), k, seed, split, exclude_flagged))
    figures = {str(name): value for name, value in result.overall.iloc[0].items()}
    return Result(dict(result.paths), {**figures, "k": result.k})


def compare(
    run_a: PathLike, run_b: PathLike, *, out: PathLike | None = None, seed: int = 0
) -> Result:
    """Write comparison.csv: paired differences per metric and document; figures hold warnings."""
    from ragexam.compare import run_compare

    result = run_compare(Path(run_a), Path(run_b), Path(out or run_b), seed)
    return Result({"comparison": result.path}, {"warnings": list(result.warnings)})


def run(
    chroma: PathLike | None = None,
    *,
    chroma_url: str | None = None,
    collection: str | None = None,
    out: PathLike = "outputs",
    limit: int | None = None,
    concurrency: int | None = None,
    model: str | None = None,
    max_error_rate: float | None = None,
    force: bool = False,
    **options: Any,
) -> Result:
    """Every stage in order; options go to the stages that take them (`samples` to judge, …)."""
    common: dict[str, Any] = {"out": out, "limit": limit, "concurrency": concurrency}
    common |= {"model": model, "max_error_rate": max_error_rate, "force": force}
    store: dict[str, Any] = {"chroma": chroma, "chroma_url": chroma_url, "collection": collection}
    own = {name: _only(options, name) for name in ("generate", "answer", "judge", "stats")}
    own["stats"].pop("split", None)  # as on the command line, run's split is generate's fraction
    unknown = set(options) - set().union(*own.values())
    if unknown:
        raise TypeError(f"run() got unexpected options: {', '.join(sorted(unknown))}")
    results = [
        generate(**store, **common, **own["generate"]),
        answer(**store, **common, **own["answer"]),
        judge(**common, **own["judge"]),
        stats(out=out, **own["stats"]),
    ]
    paths = {name: path for result in results for name, path in result.paths.items()}
    names = ("generate", "answer", "judge", "stats")
    return Result(paths, {name: r.figures for name, r in zip(names, results, strict=True)})


def _only(options: dict[str, Any], stage: str) -> dict[str, Any]:
    """The options that the stage's function takes by keyword."""
    import inspect

    function = globals()[stage]
    accepted = inspect.signature(function).parameters
    return {name: value for name, value in options.items() if name in accepted}
