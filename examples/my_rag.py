"""Your own RAG system: ragexam answer --rag examples/my_rag.py:answer --chroma examples/chroma"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import chromadb
from openai import OpenAI

# Chroma writes to a store it opens (its own bookkeeping): this example opens a copy, so the
# store you point it at stays byte for byte as it was (ragexam's own reading never writes).
source = os.environ.get("RAG_CHROMA", str(Path(__file__).parent / "chroma"))
copy = Path(tempfile.mkdtemp(prefix="my-rag-"))
atexit.register(shutil.rmtree, copy, True)
store = shutil.copytree(source, copy / "chroma")
collection = chromadb.PersistentClient(str(store)).get_collection("handbook")
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
