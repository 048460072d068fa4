"""Your own RAG system, for: cd examples && ragexam answer --rag my_rag:answer --chroma chroma"""

import os

import chromadb
from openai import OpenAI

collection = chromadb.PersistentClient(os.environ.get("RAG_CHROMA", "chroma")).get_collection(
    "handbook"
)
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
