"""Stores and RAG systems built the way LangChain, LlamaIndex, Haystack and raw chromadb build them.

Every store's vectors come from the test server's own embedding (a hashed bag of words), so a
question whose text is a chunk's text finds that chunk first, whichever code asks: ragexam's
built-in chain through the server, or the framework's own query engine in a `--rag` module.
The frameworks are the real ones (dev dependencies); only their models are fakes.
"""

import json
import re
from pathlib import Path
from typing import Any

import chromadb
from chromadb.api.client import SharedSystemClient
from openai_server import JSON, Reply, hashed_embedding

DIM = 64
CORPUS = {
    "alpha.txt": [
        "Alpha Corp was founded in 1999 in Oslo by two sailors.",
        "Alpha Corp sells copper kettles and brass lanterns to hotels.",
    ],
    "beta.txt": [
        "The beta reactor cools with heavy water pumped from the fjord.",
        "Beta shifts change at dawn, noon and midnight every weekday.",
    ],
    "sub/gamma.txt": [
        "Gamma ridge trail climbs nine hundred metres through pine forest.",
        "Hikers on gamma ridge must carry crampons from October onward.",
    ],
}


def write_corpus(folder: Path) -> Path:
    """Three text files, one in a subfolder, each of two paragraphs."""
    for name, paragraphs in CORPUS.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return folder


def exam_writer(body: JSON) -> Reply | None:
    """The exam writer asks about a chunk with the chunk's own words: its question finds it."""
    text = "\n".join(str(message.get("content") or "") for message in body["messages"])
    found = re.findall(r"<chunk>\n(.*?)\n</chunk>", text, re.DOTALL)  # the system names it too
    if not found:
        return None
    chunk = found[-1].strip()
    return Reply(content=json.dumps({"question": chunk, "answer": chunk, "key_points": [chunk]}))


def released() -> None:
    """Chroma allows one client configuration per path and process: let the next one open it."""
    SharedSystemClient.clear_system_cache()


# -- LangChain ----------------------------------------------------------------------------------


def langchain_store(path: Path, corpus: Path, collection: str = "langchain") -> Path:
    """As a LangChain tutorial: TextLoader's `source`, one Document per paragraph, uuid4 ids."""
    from langchain_chroma import Chroma
    from langchain_core.documents import Document

    documents = [
        Document(paragraph, metadata={"source": str(file)})
        for file in sorted(corpus.rglob("*.txt"))
        for paragraph in file.read_text(encoding="utf-8").split("\n\n")
    ]
    Chroma.from_documents(
        documents, HashedLangChain(), persist_directory=str(path), collection_name=collection
    )
    released()
    return path


class HashedLangChain:
    """A LangChain Embeddings with the test server's vectors."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [hashed_embedding(text.strip(), DIM) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return hashed_embedding(text.strip(), DIM)


LANGCHAIN_RAG = """
from langchain_chroma import Chroma
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from frameworks import HashedLangChain

_store = Chroma(persist_directory={path!r}, collection_name="langchain",
                embedding_function=HashedLangChain())
_retriever = _store.as_retriever(search_kwargs={{"k": 3}})
_llm = FakeListChatModel(responses=["fake answer"] * 1000)
_prompt = ChatPromptTemplate.from_template("Context: {{context}}\\nQuestion: {{question}}")

# The tutorial's chain: a string comes out, the retrieved chunks stay inside.
tutorial = ({{"context": _retriever | (lambda ds: "\\n\\n".join(d.page_content for d in ds)),
              "question": RunnablePassthrough()}} | _prompt | _llm | StrOutputParser())

# Shaped like create_retrieval_chain: {{"input", "context": [Document], "answer"}}.
retrieval_chain = RunnablePassthrough.assign(
    context=(lambda x: x["input"]) | _retriever
).assign(answer=lambda x: "fake answer")

def sources_elsewhere(question):
    return {{"answer": "fake answer", "evidence": _retriever.invoke(question)}}

def idless(question):
    found = _retriever.invoke(question)
    return {{"answer": "fake answer", "context": [type(d)(d.page_content) for d in found]}}

def blank(question):
    found = _retriever.invoke(question)
    return {{"answer": "fake answer", "context": [type(d)(page_content="") for d in found]}}

def texts(question):  # ragas' convention: "contexts", a list of the chunks' texts
    found = _retriever.invoke(question)
    return {{"answer": "fake answer", "contexts": [d.page_content for d in found]}}
"""


# -- LlamaIndex ---------------------------------------------------------------------------------


def hashed_llama_index() -> Any:
    """A LlamaIndex embed model with the test server's vectors."""
    from llama_index.core.embeddings import BaseEmbedding

    class HashedLlamaIndex(BaseEmbedding):
        def _get_query_embedding(self, query: str) -> list[float]:
            return hashed_embedding(query.strip(), DIM)

        def _get_text_embedding(self, text: str) -> list[float]:
            return hashed_embedding(text.strip(), DIM)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return hashed_embedding(query.strip(), DIM)

    return HashedLlamaIndex()


def llama_index_store(
    path: Path, corpus: Path, *, nodes: bool = False, metadata: dict[str, str] | None = None
) -> Path:
    """As LlamaIndex's starter: SimpleDirectoryReader, VectorStoreIndex over ChromaVectorStore.

    With `nodes`, the nodes are made by hand, as from another source: no file metadata. With
    `metadata`, each document has it too (as LlamaIndex's extractors add a summary, keywords),
    and LlamaIndex embeds it with the text.
    """
    from llama_index.core import SimpleDirectoryReader, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chromadb.PersistentClient(path=str(path)).get_or_create_collection("quickstart")
    vectors = ChromaVectorStore(chroma_collection=collection)
    context = StorageContext.from_defaults(vector_store=vectors)
    model = hashed_llama_index()
    if nodes:
        made = [TextNode(text=text) for paragraphs in CORPUS.values() for text in paragraphs]
        VectorStoreIndex(made, storage_context=context, embed_model=model)
    else:
        documents = SimpleDirectoryReader(str(corpus), recursive=True).load_data()
        for document in documents:
            document.metadata.update(metadata or {})
        # Words as tokens: LlamaIndex's global tokenizer is tiktoken's (a download offline), or
        # whatever an earlier caller in the process set it to.
        splitter = SentenceSplitter(
            chunk_size=16, chunk_overlap=0, paragraph_separator="\n\n", tokenizer=str.split
        )
        VectorStoreIndex.from_documents(
            documents, storage_context=context, embed_model=model, transformations=[splitter]
        )
    released()
    return path


LLAMA_INDEX_RAG = """
import chromadb
from llama_index.core import VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.vector_stores.chroma import ChromaVectorStore
from frameworks import hashed_llama_index

_collection = chromadb.PersistentClient(path={path!r}).get_collection("quickstart")
_index = VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=_collection),
                                            embed_model=hashed_llama_index())
_engine = _index.as_query_engine(llm=MockLLM(max_tokens=8), similarity_top_k=3)

def query(question):
    return _engine.query(question)

def nodes(question):
    return str(_engine.query(question)), _engine.query(question).source_nodes

engine = _engine  # the query engine itself, which is not called but queried

def no_text(question):  # a Response with the nodes alone: its `response` is None
    from llama_index.core.base.response.schema import Response
    return Response(response=None, source_nodes=_engine.query(question).source_nodes)
"""


# -- Haystack -----------------------------------------------------------------------------------


def haystack_components() -> tuple[Any, Any, Any]:
    """Haystack components: a document embedder, a text embedder, a generator (fakes)."""
    from dataclasses import replace

    from haystack import Document, component

    @component
    class HashedDocuments:
        @component.output_types(documents=list[Document])
        def run(self, documents: list[Document]) -> dict[str, Any]:
            embedded = [  # new instances, as Haystack wants: the pipeline may share the old
                replace(d, embedding=hashed_embedding((d.content or "").strip(), DIM))
                for d in documents
            ]
            return {"documents": embedded}

    @component
    class HashedText:
        @component.output_types(embedding=list[float])
        def run(self, text: str) -> dict[str, Any]:
            return {"embedding": hashed_embedding(text.strip(), DIM)}

    @component
    class FakeGenerator:
        @component.output_types(replies=list[str], meta=list[dict[str, Any]])
        def run(self, prompt: str) -> dict[str, Any]:
            meta = {"model": "fake", "finish_reason": "stop"}
            return {"replies": ["fake answer"], "meta": [meta]}

    return HashedDocuments, HashedText, FakeGenerator


def haystack_store(path: Path, corpus: Path) -> Path:
    """As Haystack's tutorial: converter, splitter, embedder, writer into ChromaDocumentStore."""
    from haystack import Pipeline
    from haystack.components.converters import TextFileToDocument
    from haystack.components.preprocessors import DocumentSplitter
    from haystack.components.writers import DocumentWriter
    from haystack_integrations.document_stores.chroma import ChromaDocumentStore

    documents, _, _ = haystack_components()
    pipeline = Pipeline()
    pipeline.add_component("converter", TextFileToDocument())
    pipeline.add_component("splitter", DocumentSplitter(split_by="passage", split_length=1))
    pipeline.add_component("embedder", documents())
    pipeline.add_component("writer", DocumentWriter(ChromaDocumentStore(persist_path=str(path))))
    pipeline.connect("converter", "splitter")
    pipeline.connect("splitter", "embedder")
    pipeline.connect("embedder", "writer")
    pipeline.run({"converter": {"sources": sorted(corpus.rglob("*.txt"))}})
    released()
    return path


HAYSTACK_RAG = """
from haystack import Pipeline
from haystack.components.builders import AnswerBuilder, PromptBuilder
from haystack_integrations.components.retrievers.chroma import ChromaEmbeddingRetriever
from haystack_integrations.document_stores.chroma import ChromaDocumentStore
from frameworks import haystack_components

_, HashedText, FakeGenerator = haystack_components()
_store = ChromaDocumentStore(persist_path={path!r})  # opened on first use, as users do
rag = Pipeline()
rag.add_component("embedder", HashedText())
rag.add_component("retriever", ChromaEmbeddingRetriever(document_store=_store, top_k=3))
rag.add_component("prompt", PromptBuilder(
    template="{{% for d in documents %}}{{{{ d.content }}}}\\n{{% endfor %}}Q: {{{{ question }}}}",
    required_variables=["question", "documents"]))
rag.add_component("llm", FakeGenerator())
rag.add_component("answer_builder", AnswerBuilder())
rag.connect("embedder.embedding", "retriever.query_embedding")
rag.connect("retriever", "prompt.documents")
rag.connect("prompt", "llm")
rag.connect("llm.replies", "answer_builder.replies")
rag.connect("llm.meta", "answer_builder.meta")
rag.connect("retriever", "answer_builder.documents")

def run(question):
    return rag.run({{"embedder": {{"text": question}}, "prompt": {{"question": question}},
                    "answer_builder": {{"query": question}}}}, include_outputs_from={{"retriever"}})

def answer(question):
    return run(question)["answer_builder"]["answers"][0]

from haystack import Document, component

@component
class Reverser:  # a ranker that puts the retriever's last first
    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]):
        return {{"documents": documents[::-1]}}

_reranking = Pipeline()
_reranking.add_component("embedder", HashedText())
_reranking.add_component("retriever", ChromaEmbeddingRetriever(document_store=_store, top_k=3))
_reranking.add_component("ranker", Reverser())
_reranking.add_component("prompt", PromptBuilder(
    template="{{% for d in documents %}}{{{{ d.content }}}}\\n{{% endfor %}}Q: {{{{ question }}}}",
    required_variables=["question", "documents"]))
_reranking.add_component("llm", FakeGenerator())
_reranking.connect("embedder.embedding", "retriever.query_embedding")
_reranking.connect("retriever", "ranker")
_reranking.connect("ranker", "prompt.documents")
_reranking.connect("prompt", "llm")

def reranked(question):  # no AnswerBuilder: the documents of the components asked for
    return _reranking.run({{"embedder": {{"text": question}}, "prompt": {{"question": question}}}},
                          include_outputs_from={{"retriever", "ranker"}})
"""


# -- raw chromadb ---------------------------------------------------------------------------------


def raw_store(path: Path, *, function: Any = None, vectors: Any = None) -> Path:
    """As chromadb's own docs: the user's ids and metadata, vectors given or made by `function`."""
    client = chromadb.PersistentClient(path=str(path))
    collection = client.create_collection("notes", embedding_function=function)
    texts = [text for paragraphs in CORPUS.values() for text in paragraphs]
    made = vectors or (lambda text: hashed_embedding(text, DIM))
    collection.add(
        ids=[f"note-{i}" for i in range(len(texts))],
        documents=texts,
        embeddings=[made(text) for text in texts],
        metadatas=[{"title": name} for name, paragraphs in CORPUS.items() for _ in paragraphs],
    )
    released()
    return path


def rag_module(folder: Path, name: str, source: str, store: Path) -> None:
    """A `--rag` module in the working directory, reading `store`."""
    (folder / f"{name}.py").write_text(source.format(path=str(store)), encoding="utf-8")
