"""Bring your own RAG: load `module:callable` and turn what it returns into an answer and hits.

The callable takes the question (a string) and returns the answer and the retrieved chunks,
best first, as a `(answer, retrieved)` tuple or a mapping with `answer` (or `result`,
`output`) and one of `retrieved`, `context`, `source_documents` or `documents`, as LangChain's
retrieval chains return them. Retrieved chunks are ids (strings) or LangChain `Document`s. An
answer alone (text, or a chat message such as an `AIMessage`) is an answer with no retrieved
chunks. It may be a plain or async function or a LangChain Runnable; a Runnable whose input is a
mapping gets the question under `input`, `question` or `query`. Plain functions run in worker
threads, `--concurrency` at a time, and each call has `--rag-timeout` seconds to answer.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import time
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

from ragexam.errors import ConfigError, RowError
from ragexam.rag.base import Hit, RagSystem
from ragexam.store.chroma import StoreRef
from ragexam.store.deadline import DeadlineExceeded, await_with_deadline

ANSWER_KEYS = ("answer", "result", "output")
RETRIEVED_KEYS = ("retrieved", "context", "source_documents", "documents")
ID_KEYS = ("id", "chunk_id", "_id")
INPUT_KEYS = ("input", "question", "query")


def load_rag(spec: str) -> Any:
    """Import `module:callable` (from the working directory first) or `path/file.py:callable`."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--rag {spec!r} must look like module:callable, e.g. my_rag:answer")
    if module_name.endswith(".py"):  # a file: its folder is searched first, for its own imports
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ConfigError(f"--rag {spec!r}: no file {module_name}")
        module_name = path.stem
        sys.path.insert(0, str(path.parent))
    elif str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--rag {spec!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while loading: their error, not ours
        reason = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"--rag {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {reason}"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
    if target is None or not (callable(target) or hasattr(target, "ainvoke")):
        raise ConfigError(f"--rag {spec!r}: {module_name} has no callable {attribute!r}")
    return target


def rag_object(rag: Any) -> Any:
    """The RAG system: `module:callable` loaded, or the callable or Runnable given itself."""
    if rag is None or not isinstance(rag, str):
        if rag is not None and not (callable(rag) or hasattr(rag, "ainvoke")):
            raise ConfigError(f"rag is {type(rag).__name__}: not a callable or a Runnable")
        return rag
    return load_rag(rag)


def rag_name(rag: Any) -> str:
    """How the answers name the RAG system: its spec, or the object's qualified name."""
    if isinstance(rag, str):
        return rag
    name = getattr(rag, "__qualname__", None) or getattr(rag, "name", None)
    return f"{getattr(rag, '__module__', '') or 'object'}:{name or type(rag).__name__}"


async def call_rag(rag: Any, question: str, seconds: float) -> tuple[str, list[Hit]]:
    """Ask the user's RAG one question; what it raises, or not answering in time, is an error.

    A plain function runs in a daemon thread that is abandoned at the deadline, so a hung
    call neither blocks the run nor keeps Ctrl-C from ending it.
    """
    try:
        result = await _within(seconds, _invoke(rag, question, seconds))
    except DeadlineExceeded:
        late = f"the RAG callable did not answer within {seconds:g}s (--rag-timeout)"
        raise RowError(late) from None
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        raise RowError(f"the RAG callable raised {type(exc).__name__}: {message}") from None
    return normalise(result)


def _invoke(rag: Any, question: str, seconds: float) -> Awaitable[Any]:
    if hasattr(rag, "ainvoke"):
        return invoke_runnable(rag, question)
    if inspect.iscoroutinefunction(rag) or inspect.iscoroutinefunction(
        getattr(rag, "__call__", None)  # noqa: B004 - an async __call__ method
    ):
        return rag(question)  # type: ignore[no-any-return]
    return await_with_deadline(rag, seconds, question)


async def _within(seconds: float, awaitable: Awaitable[Any]) -> Any:
    """Await, or raise DeadlineExceeded; the callable's own TimeoutError stays its error."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        raise DeadlineExceeded(f"no answer within {seconds:g}s")
    return task.result()


_FORMS: dict[int, str | None] = {}  # per Runnable: None for a plain string, else the input key


async def invoke_runnable(rag: Any, question: str) -> Any:
    """`ainvoke` with the question as the Runnable takes it: a string, or a mapping.

    The form comes from a legacy chain's `input_keys` or the input schema when they name one of
    `input`, `question` or `query`; else each form is tried once, and the one that works is kept.
    """
    forms = [_FORMS[id(rag)]] if id(rag) in _FORMS else _input_forms(rag)
    first: Exception | None = None
    for key in forms:
        try:
            result = await rag.ainvoke(question if key is None else {key: question})
        except (TypeError, KeyError, ValueError) as exc:  # the wrong input shape, most often
            first = first or exc
            continue
        _FORMS[id(rag)] = key
        return result
    assert first is not None
    raise first


def _input_forms(rag: Any) -> list[str | None]:
    keys = getattr(rag, "input_keys", None)
    if isinstance(keys, list) and len(keys) == 1 and isinstance(keys[0], str):
        return [str(keys[0])]
    try:
        fields = rag.get_input_jsonschema().get("properties") or {}
    except Exception:  # a Runnable that cannot describe its input
        fields = {}
    named: list[str | None] = [key for key in INPUT_KEYS if key in fields]
    return named[:1] if named else [None, *INPUT_KEYS]


def normalise(result: Any) -> tuple[str, list[Hit]]:
    """(answer, hits) from a tuple or mapping of answer and retrieved chunks, or an answer alone."""
    retrieved: Any = None
    if isinstance(result, tuple) and len(result) == 2:
        answer, retrieved = result
    elif isinstance(result, Mapping):
        answer = _first(result, ANSWER_KEYS)
        retrieved = next((result[key] for key in RETRIEVED_KEYS if key in result), None)
    elif _text(result) is not None:
        answer = result
    else:
        raise RowError(
            f"the RAG callable returned {type(result).__name__}; expected (answer, retrieved), "
            "a mapping with 'answer' and 'retrieved', or the answer alone"
        )
    text = _text(answer)
    if text is None:
        raise RowError(f"the RAG callable's answer is {type(answer).__name__}, not text")
    return text, [_hit(item) for item in retrieved or []]


def _text(value: Any) -> str | None:
    """Text from a str (or str subclass) or a chat message; None for anything else."""
    if isinstance(value, str):
        return str.__str__(value)
    content = getattr(value, "content", None)
    if isinstance(content, str):
        return content
    text = getattr(value, "text", None) if isinstance(content, list) else None
    return str.__str__(text) if isinstance(text, str) else None


def _first(result: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in result:
            return result[key]
    raise RowError(f"the RAG callable's result has none of the keys {', '.join(keys)}")


def _hit(item: Any) -> Hit:
    if isinstance(item, str):
        return Hit(item, None)
    text = getattr(item, "page_content", None)
    if text is None:
        raise RowError(f"a retrieved chunk is {type(item).__name__}, not an id or a Document")
    metadata: Mapping[str, Any] = getattr(item, "metadata", None) or {}
    chunk_id = getattr(item, "id", None) or next(
        (str(metadata[key]) for key in ID_KEYS if metadata.get(key)), None
    )
    return Hit(chunk_id, text)


class CustomRag(RagSystem):
    """The user's RAG callable, from `--rag module:callable`."""

    def __init__(
        self, rag: Any, spec: str, store: StoreRef | None, collection: Any, k: int, timeout: float
    ) -> None:
        super().__init__(store, collection, k)
        self.rag, self.name, self.timeout = rag, spec, timeout
        self.model, self.prompt_hash = f"rag:{spec}", ""

    async def answer(self, payload: Any) -> dict[str, Any]:
        """Ask the callable; match what it retrieved against the source chunk."""
        question, sources = payload
        started = time.monotonic()
        answer, hits = await call_rag(self.rag, question.text, self.timeout)
        latency = round(time.monotonic() - started, 3)
        missing = [hit.id for hit in hits if hit.text is None and hit.id is not None]
        if missing and (any(sources.texts) or self.text_chars is not None):
            texts = await self.source_texts(missing)  # ids only: texts match duplicates
            hits = [Hit(hit.id, texts.get(hit.id or "", hit.text)) for hit in hits]
        return {**self.row(answer, hits, sources), "latency_s": latency}
