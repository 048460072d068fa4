"""The built-in RAG chain: retrieve the top k chunks from the collection, answer from them."""

from __future__ import annotations

from typing import Any

from ragexam.config import Settings
from ragexam.errors import ConfigError, RagexamError, RowError
from ragexam.llm.client import LLM
from ragexam.llm.endpoint import EndpointMemory
from ragexam.llm.failures import describe
from ragexam.llm.prompts import Prompt, context_block, load_prompt
from ragexam.rag.base import Hit, Question, RagSystem, chat_figures, source_ids, sources_of
from ragexam.rag.embedders import make_embedder
from ragexam.rag.retrieval import Retriever
from ragexam.store.chroma import StoreRef


class BuiltinRag(RagSystem):
    """Retrieve the top k chunks from the collection, then answer from them with the chat model."""

    name = "builtin"

    def __init__(
        self,
        settings: Settings,
        store: StoreRef | None,
        collection: Any,
        k: int,
        *,
        trust: bool = False,
        max_chars: int = 8000,
        memory: EndpointMemory | None = None,
    ) -> None:
        super().__init__(store, collection, k)
        embedder = make_embedder(settings.embedding, collection, settings, trust)
        self.retriever = Retriever(collection, embedder, k)
        self.embedding = self.retriever.embedder.name
        self.max_chars = max_chars
        self.ready: dict[str, list[list[Hit]]] = {}  # hits of batches retrieved in advance
        self.prompt: Prompt = load_prompt("answer", settings.prompts_dir)
        bound = settings.max_tokens_for("answer")
        self.llm = LLM(settings, settings.model_for("answer"), max_tokens=bound, memory=memory)
        self.model, self.prompt_hash = self.llm.model, self.prompt.hash

    async def prepare(self, batch: list[Question]) -> list[Any]:
        """Retrieve for the whole batch; a failed batch fails its rows, not the run."""
        texts = await self.source_texts(source_ids(batch))
        try:
            hits = self.ready.pop(batch[0].qa_id, None) or await self.retriever.retrieve(
                [question.text for question in batch]
            )
        except ConfigError:
            raise  # wrong for every batch: stop the run
        except Exception as exc:  # e.g. an embedding endpoint that failed after its retries
            reason = f"retrieval failed: {describe(exc)[:300]}"
            return [RowError(reason)] * len(batch)
        return [(q, sources_of(q, texts), h) for q, h in zip(batch, hits, strict=True)]

    async def preflight(self, first: list[Question]) -> None:
        """Check that queries are embedded as the store's chunks were, then retrieve the first
        batch: the embedding works, and its dimension fits the collection.

        Its hits are kept for the run, so checking costs no extra round trip.
        """
        await self.retriever.check_agreement()
        if first:
            self.ready[first[0].qa_id] = await self.retriever.retrieve([q.text for q in first])

    async def answer(self, payload: Any) -> dict[str, Any]:
        """Answer from the retrieved chunks."""
        if isinstance(payload, RagexamError):
            raise payload
        question, sources, hits = payload
        if not question.text.strip():
            raise RowError("the question is empty")
        values = self.prompt.fill(
            question=question.text,
            context=context_block([(hit.text or "")[: self.max_chars] for hit in hits]),
        )
        reply = await self.llm.text(self.prompt.template.format_messages(**values))
        return {**self.row(reply.value, hits, sources), **reply.cost()}

    def describe(self) -> dict[str, Any]:
        """Adds where the query embeddings are computed."""
        return {**super().describe(), "embedding_endpoint": self.retriever.embedder.endpoint}

    def figures(self) -> dict[str, Any]:
        """Chat calls made, and the tokens billed."""
        return chat_figures(self.llm)

    async def aclose(self) -> None:
        """Close the chat model's and the embedder's connections, and the store's client."""
        await self.llm.aclose()
        await self.retriever.embedder.aclose()
        await super().aclose()
