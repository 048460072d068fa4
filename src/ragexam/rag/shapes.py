"""What a user's RAG returns, read as an answer and its retrieved chunks, whatever built it.

Recognised by shape, without importing any framework:
- `(answer, retrieved)`, or a mapping with `answer` (or `result`, `output`, `response`) and one
  of RETRIEVED_KEYS, as LangChain's retrieval chains return it;
- LlamaIndex's `Response` (`.response`, `.source_nodes` of `NodeWithScore`);
- Haystack's `Pipeline.run` result (`{component: {"answers" | "replies" | "documents": ...}}`)
  and its `GeneratedAnswer` (`.data`, `.documents`);
- an answer alone (text, or a chat message): an answer with no retrieved chunks.
A retrieved chunk is an id (a string), LangChain's `Document`, LlamaIndex's node or
`NodeWithScore`, Haystack's `Document`, or a mapping with an id and/or a text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ragexam.errors import RowError
from ragexam.rag.base import Hit

ANSWER_KEYS = ("answer", "result", "output", "response")
RETRIEVED_KEYS = (
    "retrieved",
    "context",
    "source_documents",
    "documents",
    "source_nodes",
    "sources",
    "contexts",
)
ID_KEYS = ("id", "chunk_id", "_id", "node_id")
TEXT_KEYS = ("text", "page_content", "content")
UNDERSTOOD = (
    "an id (str), a LangChain Document, a LlamaIndex node or NodeWithScore, a Haystack "
    "Document, or a mapping with 'id' and/or 'text'"
)


@dataclass(frozen=True)
class Got:
    """One RAG result, read: the answer, the retrieved chunks (None when it gave none at all),
    and what it was, in words, for messages."""

    answer: str
    hits: list[Hit] | None
    shape: str


def type_name(value: Any) -> str:
    """A value's type as a user recognises it: `llama_index.core...Response`, `dict`."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def read_result(result: Any) -> Got:
    """The answer and retrieved chunks of a RAG result, or RowError saying what came instead
    (or that a text holds what UTF-8 cannot write: the row could not be kept)."""
    got = _read(result)
    _writable(got.answer, "answer")
    for rank, hit in enumerate(got.hits or (), start=1):
        _writable(hit.id or "", f"chunk id at rank {rank}")
        _writable(hit.text or "", f"chunk text at rank {rank}")
    return got


def _writable(text: str, what: str) -> None:
    """RowError when the text holds a lone surrogate (a str from bytes decoded with
    `surrogateescape`, or cut mid-pair), which no UTF-8 file can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RowError(
            f"the RAG callable's {what} holds {text[exc.start : exc.end]!r} at character "
            f"{exc.start}, a lone surrogate, not a character: UTF-8 cannot write it"
        ) from None


def _read(result: Any) -> Got:
    if isinstance(result, tuple) and len(result) == 2:
        answer, retrieved = result
        return _got(answer, retrieved, f"a tuple ({type_name(answer)}, {type_name(retrieved)})")
    if isinstance(result, Mapping):
        return _mapping(result)
    if hasattr(result, "source_nodes"):  # LlamaIndex's Response (and its async variant)
        answer = getattr(result, "response", None)
        if answer is None and hasattr(result, "response_gen"):  # streamed: str() joins it
            answer = str(result)
        return _got(answer, result.source_nodes, _of(result))  # no text: no answer, not "None"
    if hasattr(result, "documents") and hasattr(result, "data"):  # Haystack's GeneratedAnswer
        return _got(result.data, result.documents, _of(result))
    if text_of(result) is not None:
        return Got(text_of(result) or "", None, f"{_of(result)} (an answer alone)")
    raise RowError(
        f"the RAG callable returned {type_name(result)}; expected (answer, retrieved), a mapping "
        "with 'answer' and 'retrieved', a LlamaIndex Response, a Haystack pipeline result, or "
        "the answer alone"
    )


def _of(value: Any) -> str:
    return type_name(value)


def _mapping(result: Mapping[str, Any]) -> Got:
    keys = ", ".join(map(str, result)) or "none"
    if not any(key in result for key in ANSWER_KEYS) and _is_pipeline(result):
        return _pipeline(result)
    answer = next((result[key] for key in ANSWER_KEYS if key in result), None)
    if answer is None:
        raise RowError(
            f"the RAG callable returned a mapping with the keys {keys}: none of "
            f"{', '.join(ANSWER_KEYS)} holds the answer"
        )
    retrieved = next((result[key] for key in RETRIEVED_KEYS if key in result), None)
    return _got(answer, retrieved, f"a mapping with the keys {keys}")


def _is_pipeline(result: Mapping[str, Any]) -> bool:
    """Haystack's Pipeline.run: each component's name, with a mapping of its outputs."""
    return bool(result) and all(isinstance(value, Mapping) for value in result.values())


def _pipeline(result: Mapping[str, Any]) -> Got:
    """The answer and documents of a Haystack pipeline's outputs.

    The documents an AnswerBuilder attached to its answer come first; else the `documents` of
    the last component that has some (with `include_outputs_from`, a ranker's after its
    retriever's: a pipeline's outputs are in the order its components ran).
    """
    outputs = list(result.values())
    answers = [item for out in outputs for item in out.get("answers") or []]
    replies = [item for out in outputs for item in out.get("replies") or []]
    shape = "a Haystack pipeline result with " + "; ".join(
        f"{name}: {', '.join(map(str, out))}" for name, out in result.items()
    )
    if answers:
        first = answers[0]
        text, documents = getattr(first, "data", first), getattr(first, "documents", None)
    elif replies:
        text, documents = replies[0], None
    else:
        raise RowError(f"the RAG callable returned {shape}: no answers or replies in it")
    if not documents:
        found = (out["documents"] for out in reversed(outputs) if out.get("documents"))
        documents = next(found, documents)
    return _got(text, documents, shape)


def _got(answer: Any, retrieved: Any, shape: str) -> Got:
    text = text_of(answer)
    if text is None:
        raise RowError(f"the RAG callable's answer is {type_name(answer)}, not text ({shape})")
    if isinstance(retrieved, str | bytes | Mapping):  # iterated, it would be letters or keys
        shown = repr(retrieved)
        shown = shown if len(shown) <= 60 else shown[:59] + "…"
        raise RowError(
            f"the RAG callable's retrieved chunks are one {type_name(retrieved)} ({shown}), not "
            f"a list of chunks: return a list, best first, each {UNDERSTOOD} ({shape})"
        )
    hits = None if retrieved is None else [hit_of(item) for item in retrieved]
    return Got(text, hits, shape)


def text_of(value: Any) -> str | None:
    """Text from a str (or a subclass), a chat message (LangChain's, Haystack's); else None."""
    if isinstance(value, str):
        return str.__str__(value)
    content = getattr(value, "content", None)
    if isinstance(content, str):
        return content
    text = getattr(value, "text", None)
    return str.__str__(text) if isinstance(text, str) else None


def hit_of(item: Any) -> Hit:
    """One retrieved chunk as an id and a text, each when known."""
    if isinstance(item, str):
        return Hit(item, None)
    if isinstance(item, Mapping):
        return _hit_mapping(item)
    node = getattr(item, "node", None)
    if node is not None and hasattr(node, "node_id"):  # LlamaIndex's NodeWithScore
        item = node
    if hasattr(item, "node_id") and callable(getattr(item, "get_content", None)):
        return Hit(str(item.node_id), str(item.get_content()))  # LlamaIndex's node
    if hasattr(item, "page_content"):  # LangChain's Document
        metadata: Mapping[str, Any] = getattr(item, "metadata", None) or {}
        found = getattr(item, "id", None) or next(
            (metadata[key] for key in ID_KEYS if metadata.get(key)), None
        )
        return Hit(None if found is None else str(found), str(item.page_content))
    content = getattr(item, "content", None)
    if hasattr(item, "id") and (content is None or isinstance(content, str)):  # Haystack's
        return Hit(str(item.id) if item.id else None, content)
    raise RowError(f"a retrieved chunk is {type_name(item)}; ragexam reads {UNDERSTOOD}")


def _hit_mapping(item: Mapping[str, Any]) -> Hit:
    found = next((item[key] for key in ID_KEYS if item.get(key)), None)
    text = next((item[key] for key in TEXT_KEYS if isinstance(item.get(key), str)), None)
    if found is None and text is None:
        keys = ", ".join(map(str, item)) or "none"
        raise RowError(
            f"a retrieved chunk is a mapping with the keys {keys}; ragexam reads {UNDERSTOOD}"
        )
    return Hit(None if found is None else str(found), text)
