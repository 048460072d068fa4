"""Bring your own RAG: load `module:callable`, call it, and rank what it retrieved.

The callable takes the question (a string) and returns the answer and the retrieved chunks,
best first, in any shape shapes.py reads (a tuple, LangChain's, LlamaIndex's or Haystack's
results). It may be a plain or async function or a LangChain Runnable; a Runnable whose input
is a mapping gets the question under `input`, `question` or `query`. Plain functions run in
worker threads, `--concurrency` at a time, and each call has `--rag-timeout` seconds to answer.

The first question is asked alone, before the others go out at once: it warms the user's
system (Haystack's Chroma store opens its client on first use, and 16 first calls at once
race), and it shows whether ragexam can see what was retrieved. A result with no retrieved
chunks, in a shape ragexam cannot read, or with chunks it cannot match to the store, stops
the stage there, saying what came back: every question would otherwise count as a miss.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any

from ragexam.errors import ConfigError, RagShapeError, RowError
from ragexam.rag.base import Hit, Question, RagSystem
from ragexam.rag.shapes import RETRIEVED_KEYS, Got, read_result
from ragexam.store.chroma import StoreRef
from ragexam.store.deadline import DeadlineExceeded, await_with_deadline

logger = logging.getLogger("ragexam")

INPUT_KEYS = ("input", "question", "query")


def load_rag(spec: str) -> Any:
    """Import `module:callable` (from the working directory first) or `path/file.py:callable`."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"--rag {spec!r} must look like module:callable, e.g. my_rag:answer")
    path = None
    if module_name.endswith(".py"):  # a file: its folder is searched first, for its own imports
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ConfigError(f"--rag {spec!r}: no file {module_name}")
        module_name = path.stem
        sys.path.insert(0, str(path.parent))
    elif str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = _imported(module_name, path)
    except ImportError as exc:
        raise ConfigError(f"--rag {spec!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while loading: their error, not ours
        reason = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"--rag {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {reason}"
        ) from None
    except SystemExit as exc:  # argparse at import, most often: it read ragexam's arguments
        raise ConfigError(
            f"--rag {spec!r}: importing {module_name!r} called sys.exit({exc.code!r}) (parse "
            'command-line arguments under `if __name__ == "__main__":`, not at import)'
        ) from None
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part, None)
    if target is None:
        raise ConfigError(f"--rag {spec!r}: {module_name} has no callable {attribute!r}")
    if not (callable(target) or hasattr(target, "ainvoke")):
        # a LlamaIndex query engine or a Haystack pipeline: the method that answers is named
        method = next((name for name in ("query", "run") if callable(getattr(target, name, 0))), "")
        named = f"name the method that answers, e.g. --rag {spec}.{method}" if method else ""
        raise ConfigError(
            f"--rag {spec!r}: {module_name}.{attribute} is a {type(target).__name__}, which "
            f"cannot be called{'; ' + named if named else ''}"
        )
    return target


def _imported(name: str, path: Path | None) -> Any:
    """The module `name`; given as a file whose name a module already loaded has (queue.py,
    types.py: the standard library's), that very file, under a name of its own."""
    loaded = sys.modules.get(name)
    if path is None or loaded is None or _file_of(loaded) == path:
        return importlib.import_module(name)
    own = f"ragexam_rag_{name}"
    found = importlib.util.spec_from_file_location(own, path)
    if found is None or found.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(found)
    sys.modules[own] = module
    found.loader.exec_module(module)
    return module


def _file_of(module: Any) -> Path | None:
    where = getattr(module, "__file__", None)
    return Path(where).resolve() if isinstance(where, str) else None


def rag_object(rag: Any) -> Any:
    """The RAG system: `module:callable` loaded, or the callable or Runnable given itself,
    checked to take the question alone."""
    if rag is None:
        return None
    if not isinstance(rag, str):
        if not (callable(rag) or hasattr(rag, "ainvoke")):
            raise ConfigError(f"rag is {type(rag).__name__}: not a callable or a Runnable")
        _check_takes_question(rag, f"rag {rag_name(rag)}")
        return rag
    loaded = load_rag(rag)
    _check_takes_question(loaded, f"--rag {rag!r}")
    return loaded


def _check_takes_question(rag: Any, named: str) -> None:
    """Refuse, in one line before any question, a callable that cannot be called with the
    question alone (`def answer(question, k)`): each row would fail with the same TypeError."""
    if hasattr(rag, "ainvoke"):
        return  # a Runnable: invoked with one input, whatever its function's signature
    try:
        signature = inspect.signature(rag)
    except (TypeError, ValueError):
        return  # a callable that Python cannot describe (a builtin): it says for itself
    try:
        signature.bind("the question")
    except TypeError as exc:
        raise ConfigError(
            f"{named}: it is called with the question alone, as f(question), but its "
            f"signature is {signature} ({exc}); give the other parameters defaults, or wrap it"
        ) from None


def rag_name(rag: Any) -> str:
    """How the answers name the RAG system: its spec, or the object's qualified name."""
    if isinstance(rag, str):
        return rag
    name = getattr(rag, "__qualname__", None) or getattr(rag, "name", None)
    return f"{getattr(rag, '__module__', '') or 'object'}:{name or type(rag).__name__}"


async def call_rag(rag: Any, question: str, seconds: float) -> Any:
    """Ask the user's RAG one question; what it raises, or not answering in time, is an error.

    A plain function runs in a daemon thread that is abandoned at the deadline, so a hung
    call neither blocks the run nor keeps Ctrl-C from ending it.
    """
    try:
        result = await _within(seconds, _kept_in(_invoke(rag, question, seconds)))
    except DeadlineExceeded:
        late = f"the RAG callable did not answer within {seconds:g}s (--rag-timeout)"
        raise RowError(late) from None
    except _Exited as exc:
        raise RowError(str(exc)) from None
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        raise RowError(f"the RAG callable raised {type(exc).__name__}: {message}") from None
    return result


class _Exited(Exception):
    """The RAG callable called sys.exit."""


async def _kept_in(awaitable: Awaitable[Any]) -> Any:
    """Await the callable; its sys.exit is its row's error (a SystemExit leaving a task
    would end the whole run, as asyncio passes it through the event loop)."""
    try:
        return await awaitable
    except SystemExit as exc:
        raise _Exited(f"the RAG callable called sys.exit({exc.code!r})") from None


def _invoke(rag: Any, question: str, seconds: float) -> Awaitable[Any]:
    if hasattr(rag, "ainvoke"):
        return invoke_runnable(rag, question)
    if inspect.iscoroutinefunction(rag) or inspect.iscoroutinefunction(
        getattr(rag, "__call__", None)  # noqa: B004 - an async __call__ method
    ):
        return _HOST.run(rag(question))
    return await_with_deadline(rag, seconds, question)


class _Host:
    """An event loop of its own, in a daemon thread, where the user's `async def` runs: one
    that blocks it (a sync client called inside an `async def`) holds that loop alone, and
    ragexam's own goes on (--rag-timeout's deadlines, Ctrl-C, the display). One for the
    process, so that what a system binds to its loop (a client's connections) serves every
    call of it, in every command."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None  # made for the first call
        self._lock = threading.Lock()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Awaitable[Any]:
        """The coroutine, run on the host's loop, as a future of the caller's."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                name = "ragexam-rag-loop"
                threading.Thread(target=loop.run_forever, name=name, daemon=True).start()
                self._loop = loop
        ran = asyncio.run_coroutine_threadsafe(_contained(coroutine), self._loop)
        return asyncio.wrap_future(ran)


async def _contained(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """The coroutine, whose sys.exit is its row's error: leaving its task, a SystemExit would
    stop the host's loop, and every call after it would wait for nothing."""
    try:
        return await coroutine
    except SystemExit as exc:
        raise _Exited(f"the RAG callable called sys.exit({exc.code!r})") from None


_HOST = _Host()


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
        if first is not None and key is not None:  # learned from a failure: said, once
            said = " ".join(str(first).split())[:200]
            logger.warning(
                f"the RAG chain raised {type(first).__name__} ({said}) when given the question "
                f"as a string, and answered it as {{{key!r}: question}}: every question goes to "
                "it so"
            )
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


class CustomRag(RagSystem):
    """The user's RAG callable, from `--rag module:callable`."""

    def __init__(
        self, rag: Any, spec: str, store: StoreRef | None, collection: Any, k: int, timeout: float
    ) -> None:
        super().__init__(store, collection, k)
        self.rag, self.name, self.timeout = rag, spec, timeout
        self.model, self.prompt_hash = f"rag:{spec}", ""
        # the first question's result, asked alone, or what it raised: its row takes it
        self.ready: dict[str, tuple[Any, float] | RowError] = {}

    async def preflight(self, first: list[Question]) -> None:
        """Ask the first question alone: a warm-up, and a look at what comes back."""
        if not first:
            return
        started = time.monotonic()
        try:
            result = await call_rag(self.rag, first[0].text, self.timeout)
        except RowError as exc:  # that question's own failure: its row says so, unasked again
            self.ready[first[0].qa_id] = exc
            return
        self.ready[first[0].qa_id] = (result, round(time.monotonic() - started, 3))
        try:
            got = read_result(result)
        except RowError as exc:
            raise RagShapeError(f"--rag {self.name}: {exc}; {FIX}") from None
        await self._check_visible(first[0], got)
        if got.hits is not None and len(got.hits) > self.k:  # ranked past k: counted missed
            logger.warning(
                f"--rag {self.name} retrieved {len(got.hits)} chunks for the first question, "
                f"more than --k {self.k}: a source ranked past {self.k} counts as missed; pass "
                f"--k {len(got.hits)} if your system answers from all of them"
            )

    async def _check_visible(self, question: Question, got: Got) -> None:
        """Stop when no retrieved chunk could ever be matched to the question's source."""
        if got.hits is None:
            raise RagShapeError(
                f"--rag {self.name} returned {got.shape}, with no retrieved chunks: every "
                f"question would count as a miss; {FIX}"
            )
        if not got.hits or any(hit.text for hit in got.hits):
            return
        ids = [hit.id for hit in got.hits if hit.id is not None]
        if not ids:
            raise RagShapeError(
                f"--rag {self.name} returned {got.shape}, whose retrieved chunks have neither "
                f"an id nor a text: ragexam cannot tell which chunks they are; {FIX}"
            )
        if self.collection is not None and not await self.source_texts(ids):
            shown = ", ".join(repr(chunk_id) for chunk_id in ids[:3])
            raise RagShapeError(
                f"--rag {self.name} returned {got.shape}, whose retrieved chunks' ids ({shown}) "
                "are not ids of the store's chunks, and carry no text to match by: is it "
                "reading another store or collection? Return the store's ids, or the chunks "
                "with their texts (a Document, or a mapping with 'text': a plain string is read "
                "as an id)"
            )

    async def answer(self, payload: Any) -> dict[str, Any]:
        """Ask the callable; match what it retrieved against the source chunk."""
        question, sources = payload
        ready = self.ready.pop(question.qa_id, None)
        if isinstance(ready, RowError):
            raise ready
        if ready is None:
            started = time.monotonic()
            result = await call_rag(self.rag, question.text, self.timeout)
            ready = (result, round(time.monotonic() - started, 3))
        got = read_result(ready[0])
        hits = got.hits or []
        missing = [hit.id for hit in hits if hit.text is None and hit.id is not None]
        wanted = any(sources.texts) or any(sources.hashes) or self.text_chars is not None
        if missing and wanted:
            texts = await self.source_texts(missing)  # ids only: texts match duplicates
            hits = [Hit(hit.id, texts.get(hit.id or "", hit.text)) for hit in hits]
        return {**self.row(got.answer, hits, sources), "latency_s": ready[1]}


FIX = (
    "return (answer, retrieved) or a mapping with 'answer' and one of "
    f"{', '.join(RETRIEVED_KEYS)}, with the retrieved chunks best first (docs/frameworks.md)"
)
