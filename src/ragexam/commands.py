"""A command's options, by name, built into settings and its stage's options.

The CLI and the Python API both hand their options here under the same names
(`--max-error-rate` is `max_error_rate`), so an option a stage understands reaches both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexam.config import AnswerContext, Scale, Settings, load_settings
from ragexam.errors import ConfigError
from ragexam.store.chroma import StoreRef

if TYPE_CHECKING:
    from ragexam.stages.answer import AnswerOptions
    from ragexam.stages.generate import GenerateOptions
    from ragexam.stages.judge import JudgeOptions

Given = Mapping[str, Any]  # a command's options by name, every one of them present
Notify = Callable[[str], None]  # told what the store reading notes, e.g. a copy was read
# `run --controls`: the folder of each control run, and what its answerer is given
CONTROL_RUNS = {"gold": AnswerContext.gold, "closed_book": AnswerContext.none}


def store_ref(
    chroma: str | Path | None,
    chroma_url: str | None,
    collection: str | None,
    settings: Settings | None = None,
    notify: Notify | None = None,
) -> StoreRef:
    """The store the options point at; exactly one of --chroma and --chroma-url."""
    if (chroma is None) == (chroma_url is None):
        raise ConfigError("give exactly one of --chroma PATH and --chroma-url URL")
    server: dict[str, Any] = {}
    if settings is not None and chroma_url is not None:  # where on the server, and its token
        key = settings.chroma_api_key.get_secret_value() if settings.chroma_api_key else None
        server = {"tenant": settings.chroma_tenant, "database": settings.chroma_database}
        server["token"] = key or None
    timeout = settings.store_timeout if settings is not None else 60.0
    path = Path(chroma) if chroma is not None else None
    return StoreRef(path, chroma_url, collection, notify=notify, timeout=timeout, **server)


def _settings(given: Given, **own: Any) -> Settings:
    """Settings from the options every LLM stage takes, and the stage's own."""
    shared = ("concurrency", "max_error_rate", "rpm", "tpm")
    return load_settings(**{name: given[name] for name in shared}, **own)


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value is not None else None


def generate_setup(given: Given, notify: Notify | None = None) -> tuple[Settings, GenerateOptions]:
    """generate's settings and options."""
    from ragexam.analysis.sampling import Sampling
    from ragexam.stages.generate import GenerateOptions

    settings = _settings(
        given,
        generate_model=given["model"],
        structured_output=given["structured_output"],
        chroma_tenant=given["chroma_tenant"],
        chroma_database=given["chroma_database"],
    )
    store = store_ref(given["chroma"], given["chroma_url"], given["collection"], settings, notify)
    sampling = Sampling(given["sample"], given["per_document"], given["seed"], given["split"])
    out, limit, doc_key = Path(given["out"]), given["limit"], given["doc_key"]
    chars, force, check = given["max_chunk_chars"], given["force"], given["check"]
    return settings, GenerateOptions(store, out, limit, doc_key, chars, force, sampling, check)


def answer_setup(given: Given, notify: Notify | None = None) -> tuple[Settings, AnswerOptions]:
    """answer's settings and options; the store only when something reads it."""
    from ragexam.stages.answer import AnswerOptions

    settings = _settings(
        given,
        answer_model=given["model"],
        embedding=given["embedding"],
        chroma_tenant=given["chroma_tenant"],
        chroma_database=given["chroma_database"],
    )
    context = AnswerContext(given["context"])
    has_store = given["chroma"] is not None or given["chroma_url"] is not None
    rag = given["rag"]  # "module:callable", or from the API the callable itself
    needs_store = (rag is None or rag == "") and context != AnswerContext.none
    where = (given["chroma"], given["chroma_url"], given["collection"])
    store = store_ref(*where, settings, notify) if has_store or needs_store else None
    return settings, AnswerOptions(
        store,
        Path(given["out"]),
        _path(given["qa_dataset"]),
        given["k"],
        given["limit"],
        given["rag"],
        given["force"],
        context,
        trust_store_endpoint=given["trust_store_endpoint"],
        rag_timeout=given["rag_timeout"],
        max_chunk_chars=given["max_chunk_chars"],
        texts=given["texts"],
    )


def judge_setup(given: Given) -> tuple[Settings, JudgeOptions]:
    """judge's settings and options."""
    from ragexam.stages.judge import JudgeOptions

    settings = _settings(
        given, judge_model=given["model"], structured_output=given["structured_output"]
    )
    return settings, JudgeOptions(
        Path(given["out"]),
        _path(given["qa_dataset"]),
        _path(given["answers"]),
        given["limit"],
        given["samples"],
        given["temperature"],
        Scale(given["scale"]),
        given["force"],
        given["controls"],
        given["seed"],
    )


def check_run(given: Given) -> None:
    """Refuse run's options that cannot go together, and a malformed gate, before any call."""
    if given["controls"] and given["rag"] not in (None, ""):
        raise ConfigError(
            "--controls answer with the built-in answerer, which is not your --rag system: "
            "their completeness would compare two answerers; run them without --rag"
        )
    if given["fail_under"] is not None:
        from ragexam.analysis.gates import parse_bounds

        parse_bounds(given["fail_under"])


def run_setup(
    given: Given, notify: Notify | None = None
) -> tuple[Settings, GenerateOptions, AnswerOptions, JudgeOptions]:
    """run's settings and each stage's options, as they are before any stage ran (--dry-run)."""
    stages = {**given, "qa_dataset": None, "answers": None, "controls": given["judge_controls"]}
    _, generate = generate_setup(stages, notify)
    _, answer = answer_setup(stages, notify)
    _, judge = judge_setup(stages)
    model, where = given["model"], (given["chroma_tenant"], given["chroma_database"])
    settings = _settings(
        given,
        generate_model=model,
        answer_model=model,
        judge_model=model,
        embedding=given["embedding"],
        structured_output=given["structured_output"],
        chroma_tenant=where[0],
        chroma_database=where[1],
    )
    return settings, generate, answer, judge
