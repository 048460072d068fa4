"""Your own RAG system: ragexam answer --rag examples/my_rag.py:answer --chroma examples/chroma"""

import os
from pathlib import Path

import chromadb
from openai import OpenAI

store = os.environ.get("RAG_CHROMA", str(Path(__file__).parent / "chroma"))
collection = chromadb.PersistentClient(store).get_collection("handbook")
llm = OpenAI()


def answer(question: str) -> dict:
    """Retrieve 5 chunks, answer from them, and return the answer with the retrieved ids."""
    hits = collection.query(query_texts=[question], n_results=5)
    context = "\n\n".join(hits["documents"][0])
    reply = llm.chat.completions.create(
        model=os.environ.get("RAGEXAM_MODEL", "gpt-4o-mini"),
        messages=[{"role": "user", "content": f"Context:\n{context}\n\nQuestion: {question}"}],
    )
    return {"answer": reply.choices[0].message.content, "retrieved": hits["ids"][0]}
