"""Query embeddings for the built-in chain: the store's own function, or an OpenAI endpoint.

Query embeddings come from the embedding function Chroma persisted with the collection
(`--embedding collection`) or from an OpenAI-compatible endpoint (`--embedding openai:MODEL`).
Nothing falls back silently: a collection without a persisted function needs `--embedding`.
A stored function may name its own endpoint and key variable; a key is only ever sent to the
hosts the user named (keys.py).
"""

from __future__ import annotations

import asyncio
import math
import warnings
from contextlib import suppress
from typing import Any, Protocol

import openai

from ragexam.config import OPENAI_URL, Settings, env_file_lent
from ragexam.errors import ConfigError, EndpointError, StoreError
from ragexam.llm.failures import describe
from ragexam.rag.keys import check_key_destination
from ragexam.store.provenance import NAMES_DEFAULT_FUNCTION, built_by
from ragexam.urls import mask_url


class Embedder(Protocol):
    """Turns a batch of questions into query vectors."""

    name: str
    endpoint: str | None

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One vector per text."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class CollectionEmbedder:
    """The embedding function Chroma stored with the collection."""

    def __init__(self, collection: Any, settings: Settings, trust: bool = False) -> None:
        try:
            with env_file_lent():  # the function reads its key variable from the environment
                function = collection.configuration.get("embedding_function")
        except ValueError as exc:  # Chroma could not make it: a key variable unset, as a rule
            raise ConfigError(
                f"the embedding function stored with collection {collection.name!r} cannot be "
                f"made: {' '.join(str(exc).split())[:300]}; the questions are embedded with it, "
                "so set what it asks for, or pass --embedding openai:MODEL"
            ) from None
        tool = built_by(collection)
        if function is None:
            why = "as LangChain stores have none" if tool == "LangChain" else "it was made "
            why += "" if tool == "LangChain" else "with embedding_function=None"
            raise ConfigError(
                f"collection {collection.name!r} has no embedding function stored with it "
                f"({why}): pass --embedding openai:MODEL with the model the store was built "
                "with, or set RAGEXAM_EMBEDDING"
            )
        if tool in NAMES_DEFAULT_FUNCTION and _function_name(function) == "default":
            raise ConfigError(
                f"collection {collection.name!r} was built by {tool}, which stores Chroma's "
                "default embedding function with it although its own embed model made the "
                "vectors: pass --embedding openai:MODEL with the model the store was built with"
            )
        self.function = function
        self.name = f"collection:{_function_name(function)}"
        self.endpoint = check_key_destination(function, self.name, settings, trust)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Embed in a worker thread: Chroma's functions are synchronous."""
        call = getattr(self.function, "embed_query", self.function)
        try:
            vectors = await asyncio.to_thread(call, input=texts)
        except Exception as exc:
            raise StoreError(
                f"the collection's embedding function ({self.name}) failed: "
                f"{' '.join(str(exc).split())[:300]}; pass --embedding openai:MODEL to embed "
                "with your endpoint instead"
            ) from None
        with suppress(TypeError, ValueError):  # numpy arrays, as Chroma's give: else said below
            vectors = [list(map(float, vector)) for vector in vectors]
        found, problem = plain_vectors(vectors, len(texts))
        if problem:
            raise StoreError(
                f"the collection's embedding function ({self.name}) {problem}; pass "
                "--embedding openai:MODEL to embed with your endpoint instead"
            )
        return found

    async def aclose(self) -> None:
        """Nothing to release: Chroma owns the function."""


def _function_name(function: Any) -> str:
    name = getattr(function, "name", None)
    return str(name()) if callable(name) else type(function).__name__


class OpenAIEmbedder:
    """OpenAI-compatible embeddings; the SDK's own retry layer is the only one for these."""

    def __init__(self, settings: Settings, model: str) -> None:
        from langchain_openai import OpenAIEmbeddings

        self.name = f"openai:{model}"
        base_url = settings.embedding_base_url or settings.openai_base_url
        self.base_url = mask_url(base_url or OPENAI_URL)
        self.endpoint: str | None = self.base_url
        self.redact = settings.redact
        self.client = OpenAIEmbeddings(
            model=model,
            openai_api_key=settings.api_key(),
            openai_api_base=base_url or OPENAI_URL,
            request_timeout=settings.timeout,
            max_retries=settings.max_retries,
            check_embedding_ctx_length=False,  # would download tiktoken's encodings
            http_async_client=openai.DefaultAsyncHttpxClient(),  # not the loop-bound shared one
        )

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """One HTTP call per batch of questions; one vector per question, or a ConfigError.

        A failure after the retries is an EndpointError that says which endpoint failed.
        """
        with warnings.catch_warnings():  # a per-token reply trips pydantic's serializer warning
            warnings.filterwarnings("ignore", "Pydantic serializer warnings", UserWarning)
            try:
                vectors = await self.client.aembed_documents(texts)
            except openai.APIError as exc:
                raise EndpointError(
                    f"the embedding endpoint ({self.name} at {self.base_url}) failed: "
                    f"{self.redact(describe(exc))}; check RAGEXAM_EMBEDDING_BASE_URL or "
                    "OPENAI_BASE_URL, the key, and the model name"
                ) from None
            except (ValueError, KeyError, AttributeError, TypeError) as exc:
                # Not wrapped by the SDK (as its HTTP client's failures are): reading the reply.
                said = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                raise EndpointError(
                    f"the embedding endpoint ({self.name} at {self.base_url}) answered with "
                    f"what is not a list of embeddings ({said})"
                ) from None
        per_token = next((v for v in vectors if v and isinstance(v[0], list)), None)
        if per_token is not None:
            raise ConfigError(
                f"the embedding endpoint ({self.name}) returned one vector per token "
                f"({len(per_token)} vectors for one question), not one per text: it does not "
                "pool: llama.cpp's own llama-server pools with --pooling mean; llama-cpp-python's "
                "server has no such option, so serve the embedding model with llama-server, or "
                "point RAGEXAM_EMBEDDING_BASE_URL at another embedding endpoint"
            )
        found, problem = plain_vectors(vectors, len(texts))
        if problem:
            raise EndpointError(
                f"the embedding endpoint ({self.name} at {self.base_url}) {problem}"
            )
        return found

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self.client.http_async_client is not None:
            await self.client.http_async_client.aclose()


def plain_vectors(vectors: Any, count: int) -> tuple[list[list[float]], str | None]:
    """The vectors, or what is wrong with them: one vector a text, all of one length, each a
    list of numbers, as told by its ends (19 µs a batch of 64 at 1,536 dimensions; every
    number would take 1.8 ms, half a minute at a million questions, for what JSON already made
    numbers), and finite, as told by their sum (~0.4 ms a batch: a NaN in a vector, as a
    base64 reply can carry, would rank every chunk alike)."""
    if not isinstance(vectors, list) or len(vectors) != count:
        got = len(vectors) if isinstance(vectors, list) else "no list of"
        return [], f"answered {got} vectors for {count} texts"
    if not all(
        isinstance(vector, list) and vector and _number(vector[0]) and _number(vector[-1])
        for vector in vectors
    ):
        return [], "answered vectors that are not lists of numbers"
    if len({len(vector) for vector in vectors}) > 1:
        return [], "answered vectors of different lengths for one batch of texts"
    try:
        finite = all(math.isfinite(sum(vector)) for vector in vectors)
    except TypeError:  # a null (JSON's NaN, as many servers write it) or a text inside
        return [], "answered vectors that are not lists of numbers"
    if not finite:
        return [], "answered vectors holding NaN or infinite numbers"
    return vectors, None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def make_embedder(spec: str, collection: Any, settings: Settings, trust: bool = False) -> Embedder:
    """The embedder an `--embedding` spec names; `trust` lets a store's endpoint get a key."""
    if spec == "collection":
        return CollectionEmbedder(collection, settings, trust)
    if spec.startswith("openai:") and len(spec) > len("openai:"):
        return OpenAIEmbedder(settings, spec.removeprefix("openai:"))
    raise ConfigError(f"--embedding {spec!r} is not 'collection' or 'openai:MODEL'")
