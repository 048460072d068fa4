"""Control answerers: the built-in answer model given the source chunk alone, or no context.

`--context gold` measures what the answerer does when retrieval is perfect; `--context none`
measures what it knows without any document. Both use the same answer model as the RAG run.
"""

from __future__ import annotations

from typing import Any

from ragexam.config import AnswerContext, Settings
from ragexam.errors import RowError
from ragexam.llm.client import LLM
from ragexam.llm.endpoint import EndpointMemory
from ragexam.llm.prompts import Prompt, context_block, load_prompt
from ragexam.rag.base import Hit, Question, RagSystem, answer_row, chat_figures, sources_of
from ragexam.store.chroma import StoreRef

PROMPTS = {AnswerContext.gold: "answer", AnswerContext.none: "answer_closed_book"}


class GivenContext(RagSystem):
    """Answer each question from a context chosen by ragexam, not retrieved."""

    name = "builtin"

    def __init__(
        self,
        settings: Settings,
        store: StoreRef | None,
        collection: Any,
        context: AnswerContext,
        max_chars: int,
        *,
        memory: EndpointMemory | None = None,
    ) -> None:
        super().__init__(store, collection, 0)
        self.context, self.max_chars = context, max_chars  # the source chunk is cut, as retrieved
        self.prompt: Prompt = load_prompt(PROMPTS[context], settings.prompts_dir)
        self.llm = LLM(settings, settings.model_for("answer"), memory=memory)
        self.model, self.prompt_hash = self.llm.model, self.prompt.hash

    def fixed(self) -> dict[str, Any]:
        """No k and no embedding: nothing is retrieved."""
        return {"k": None, "context": self.context.value, "embedding": None}

    async def prepare(self, batch: list[Question]) -> list[Any]:
        """Gold reads the batch's source chunks in one store call; closed-book reads nothing."""
        if self.context == AnswerContext.none:
            return [(question, sources_of(question, {})) for question in batch]
        return await super().prepare(batch)

    async def answer(self, payload: Any) -> dict[str, Any]:
        """Answer from the source chunks (none for an unanswerable question), or from nothing."""
        question, sources = payload
        if not question.text.strip():
            raise RowError("the question is empty")
        values = {"question": question.text}
        gold = self.context == AnswerContext.gold
        if gold:
            missing = [
                i for i, text in zip(sources.ids, sources.texts, strict=True) if text is None
            ]
            if missing:
                raise RowError(f"the source chunk {missing[0]!r} is not in the store")
            values["context"] = context_block([text[: self.max_chars] for text in sources.texts])
        reply = await self.llm.text(
            self.prompt.template.format_messages(**self.prompt.fill(**values))
        )
        hits = [Hit(chunk_id, None) for chunk_id in sources.ids] if gold else []
        ranks = list(range(1, len(sources.ids) + 1)) if gold else [None] * len(sources.ids)
        return {**answer_row(reply.value, hits, ranks), **reply.cost()}

    def figures(self) -> dict[str, Any]:
        """Chat calls made, and the tokens billed."""
        return chat_figures(self.llm)

    async def aclose(self) -> None:
        """Close the chat model's connections and the store's client."""
        await self.llm.aclose()
        await super().aclose()
