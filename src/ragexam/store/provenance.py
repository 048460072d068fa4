"""Which tool built a collection, from what it writes: messages name the tool the user knows.

LlamaIndex writes `_node_content` and `_node_type` into every record's metadata; Haystack's
ChromaDocumentStore writes `source_id` and `split_id`; LangChain's Chroma leaves the metadata
as the user's loaders made it, in a collection named `langchain` unless told otherwise. Both
LlamaIndex and Haystack persist Chroma's default embedding function with the collection,
although their own embed model made the vectors.
"""

from __future__ import annotations

from typing import Any

SAMPLE = 20
NAMES_DEFAULT_FUNCTION = ("LlamaIndex", "Haystack")  # they persist "default", wrongly


def built_by(collection: Any) -> str | None:
    """ "LlamaIndex", "Haystack" or "LangChain" when the records show it; else None."""
    try:
        page = collection.get(limit=SAMPLE, include=["metadatas"])
    except Exception:  # a store that cannot be sampled names no tool
        return None
    metadatas = [meta or {} for meta in page.get("metadatas") or []]
    if any("_node_content" in meta or "_node_type" in meta for meta in metadatas):
        return "LlamaIndex"
    if metadatas and all("source_id" in meta and "split_id" in meta for meta in metadatas):
        return "Haystack"
    if str(getattr(collection, "name", "")) == "langchain":
        return "LangChain"
    return None
