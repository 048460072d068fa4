"""Stores and RAG systems as LangChain, LlamaIndex, Haystack and raw chromadb build them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import support
from frameworks import (
    CORPUS,
    DIM,
    HAYSTACK_RAG,
    LANGCHAIN_RAG,
    LLAMA_INDEX_RAG,
    exam_writer,
    haystack_store,
    langchain_store,
    llama_index_store,
    rag_module,
    raw_store,
    write_corpus,
)
from openai_server import FakeOpenAI, hashed_embedding
from support import read_csv, run_cli

Builder = Callable[[Path, Path], Path]
STORES: dict[str, Builder] = {
    "langchain": langchain_store,
    "llama_index": llama_index_store,
    "haystack": haystack_store,
    "raw": lambda path, corpus: raw_store(path),
}
PARAGRAPHS = sum(len(paragraphs) for paragraphs in CORPUS.values())


def full_paths(corpus: Path) -> set[str]:
    return {str(corpus / name) for name in CORPUS}


# What each store's documents are named by, and the names (the corpus folder filled in).
NAMES: dict[str, tuple[str, Callable[[Path], set[str]]]] = {
    "langchain": ("source", full_paths),
    "llama_index": ("file_path", full_paths),
    "haystack": ("file_path", lambda corpus: {Path(name).name for name in CORPUS}),
    "raw": ("title", lambda corpus: set(CORPUS)),
}


def exam(env: FakeOpenAI, tmp_path: Path, kind: str) -> tuple[Path, Path, str]:
    """A store built by `kind`, and the output of `generate` on it (questions find their chunk)."""
    corpus = write_corpus(tmp_path / "corpus")
    store = STORES[kind](tmp_path / f"store_{kind}", corpus)
    env.responder = exam_writer
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    return store, corpus, result.output


@pytest.mark.parametrize("kind", list(STORES))
def test_each_store_is_read_with_its_own_document_names(
    env: FakeOpenAI, tmp_path: Path, kind: str
) -> None:
    _, corpus, output = exam(env, tmp_path, kind)
    key, names = NAMES[kind]
    rows = read_csv(tmp_path / "run" / "qa_dataset.csv")
    assert {row["document"] for row in rows} == names(corpus)
    assert f"documents are named by the metadata field {key!r}" in " ".join(output.split())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["generate"]["options"]["doc_key_used"] == key


def test_a_llama_index_store_that_embedded_its_metadata_is_read_by_the_built_in_chain(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # LlamaIndex embeds a node's metadata with its text: the check that the query embeddings
    # are the store's embedded the text alone, found cosine 0.6, and refused the right model.
    summary = {
        "summary": "A note on industry.",
        "keywords": "Norway, history",
    }
    corpus = write_corpus(tmp_path / "corpus")
    store = llama_index_store(tmp_path / "store", corpus, metadata=summary)
    env.responder = exam_writer
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    chunks = read_csv(tmp_path / "run" / "qa_dataset.csv")  # the metadata took room: smaller
    assert len(rows) == len(chunks) > PARAGRAPHS
    assert {row["target_rank"] for row in rows} == {"1"}


def test_the_text_a_llama_index_vector_was_made_from_is_llama_index_s_own() -> None:
    from llama_index.core.schema import MetadataMode, TextNode
    from llama_index.core.vector_stores.utils import node_to_metadata_dict

    from ragexam.rag.retrieval import embedded_text

    nodes = [
        TextNode(text="Plain."),
        TextNode(text="Kept.", metadata={"file_path": "/a/b.md", "n": 3}),
        TextNode(text="Left.", metadata={"a": "x", "b": "y"}, excluded_embed_metadata_keys=["b"]),
        TextNode(text="All out.", metadata={"a": "x"}, excluded_embed_metadata_keys=["a"]),
        TextNode(
            text="Own.",
            metadata={"a": "x", "c": "z"},
            metadata_template="{key}={value}",
            metadata_separator=" | ",
            text_template="[{metadata_str}] {content}",
        ),
    ]
    for node in nodes:
        stored = node_to_metadata_dict(node, remove_text=True, flat_metadata=True)
        assert embedded_text(node.text, stored) == node.get_content(MetadataMode.EMBED)
    assert embedded_text("Bare.", {"source": "a.md"}) == embedded_text("Bare.", None) == "Bare."


def test_a_llama_index_store_built_from_nodes_is_not_one_document_called_none(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store = llama_index_store(tmp_path / "store", write_corpus(tmp_path / "corpus"), nodes=True)
    result = run_cli("generate", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 0, result.output
    documents = {row["document"] for row in read_csv(tmp_path / "run" / "qa_dataset.csv")}
    assert documents == {"(unknown)"}
    assert "the chunks have no metadata" in " ".join(result.output.split())


@pytest.mark.parametrize("kind", list(STORES))
def test_the_built_in_chain_ranks_every_source_first_on_each_store(
    env: FakeOpenAI, tmp_path: Path, kind: str
) -> None:
    store, _, _ = exam(env, tmp_path, kind)
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--embedding", "openai:e")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == PARAGRAPHS and {row["target_rank"] for row in rows} == {"1"}


# (store, module source, callable): each framework's own result, as its docs return it.
RAGS = {
    "langchain retrieval chain": ("langchain", LANGCHAIN_RAG, "retrieval_chain"),
    "langchain Documents without ids": ("langchain", LANGCHAIN_RAG, "idless"),
    "llama_index Response": ("llama_index", LLAMA_INDEX_RAG, "query"),
    "llama_index NodeWithScore": ("llama_index", LLAMA_INDEX_RAG, "nodes"),
    "haystack Pipeline.run": ("haystack", HAYSTACK_RAG, "run"),
    "haystack GeneratedAnswer": ("haystack", HAYSTACK_RAG, "answer"),
}


@pytest.mark.parametrize("name", list(RAGS))
def test_each_frameworks_own_result_is_taken_and_ranked_right(
    env: FakeOpenAI, tmp_path: Path, name: str
) -> None:
    kind, source, target = RAGS[name]
    store, _, _ = exam(env, tmp_path, kind)
    rag_module(tmp_path, f"rag_{kind}", source, store)
    # 16 at once: Haystack's store opens its Chroma client on first use, and 16 first calls
    # race in chromadb; the first question is asked alone.
    args = ("--chroma", str(store), "--out", "run", "--concurrency", "16")
    result = run_cli("answer", *args, "--rag", f"rag_{kind}:{target}")
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert {row["status"] for row in rows} == {"ok"}, [row["error"] for row in rows]
    assert len(rows) == PARAGRAPHS and {row["target_rank"] for row in rows} == {"1"}


def test_a_haystack_pipeline_is_ranked_by_the_documents_its_last_step_gave(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # With a retriever's and a ranker's documents in its outputs, the retriever's order was
    # taken: the ranker's is the one the prompt was given.
    store, _, _ = exam(env, tmp_path, "haystack")
    rag_module(tmp_path, "rag_haystack", HAYSTACK_RAG, store)
    args = ("--chroma", str(store), "--out", "run", "--rag", "rag_haystack:reranked")
    result = run_cli("answer", *args)
    assert result.exit_code == 0, result.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert len(rows) == PARAGRAPHS and {row["target_rank"] for row in rows} == {"3"}


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("tutorial", "langchain_core.messages.base.TextAccessor (an answer alone)"),
        ("sources_elsewhere", "a mapping with the keys answer, evidence"),
        ("blank", "neither an id nor a text"),
        # it said "Return the store's ids, or the chunks' texts": what it had returned
        (
            "texts",
            "or the chunks with their texts (a Document, or a mapping with 'text': a "
            "plain string is read as an id)",
        ),
    ],
)
def test_a_rag_whose_chunks_ragexam_cannot_see_stops_at_the_first_question(
    env: FakeOpenAI, tmp_path: Path, target: str, said: str
) -> None:
    store, _, _ = exam(env, tmp_path, "langchain")
    rag_module(tmp_path, "rag_lc", LANGCHAIN_RAG, store)
    result = run_cli("answer", "--chroma", str(store), "--out", "run", "--rag", f"rag_lc:{target}")
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
    assert read_csv(tmp_path / "run" / "answers.csv") == []  # no question scored as a miss


def test_a_query_engine_is_named_by_its_method_and_a_response_with_no_text_is_no_answer(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    # The engine itself was "rag_llama_index has no callable 'engine'", though it has; and a
    # Response of response_mode="no_text" was graded as the answer "None".
    store, _, _ = exam(env, tmp_path, "llama_index")
    rag_module(tmp_path, "rag_llama_index", LLAMA_INDEX_RAG, store)
    args = ("answer", "--chroma", str(store), "--out", "run", "--rag")
    named = run_cli(*args, "rag_llama_index:engine")
    assert named.exit_code == 2, named.output
    assert " ".join(named.output.split()) == (
        "Error: --rag 'rag_llama_index:engine': rag_llama_index.engine is a "
        "RetrieverQueryEngine, which cannot be called; name the method that answers, e.g. "
        "--rag rag_llama_index:engine.query"
    )
    untold = run_cli(*args, "rag_llama_index:no_text")
    assert untold.exit_code == 2, untold.output
    assert "the RAG callable's answer is NoneType, not text (" in " ".join(untold.output.split())
    assert read_csv(tmp_path / "run" / "answers.csv") == []  # no row graded as "None"
    asked = run_cli(*args, "rag_llama_index:engine.query")
    assert asked.exit_code == 0, asked.output
    rows = read_csv(tmp_path / "run" / "answers.csv")
    assert {row["status"] for row in rows} == {"ok"} and {r["target_rank"] for r in rows} == {"1"}


def test_a_store_built_again_with_new_ids_still_finds_each_source_by_its_text(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    store, corpus, _ = exam(env, tmp_path, "langchain")
    shutil.rmtree(store)
    langchain_store(store, corpus)  # the same files again: LangChain draws new ids
    rag_module(tmp_path, "rag_lc", LANGCHAIN_RAG, store)
    ways = {"run": ("--embedding", "openai:e"), "mine": ("--rag", "rag_lc:retrieval_chain")}
    for run, how in ways.items():
        args = ("--chroma", str(store), "--qa-dataset", "run/qa_dataset.csv", "--out", run, *how)
        result = run_cli("answer", *args)
        assert result.exit_code == 0, result.output
        said = " ".join(result.output.split())
        assert f"{PARAGRAPHS} of {PARAGRAPHS} of the exam's chunk ids are not in the store" in said
        rows = read_csv(tmp_path / run / "answers.csv")
        assert {row["target_rank"] for row in rows} == {"1"}, run


@pytest.mark.parametrize("kind", ["llama_index", "haystack"])
def test_a_stored_default_function_that_did_not_make_the_vectors_is_refused(
    env: FakeOpenAI, tmp_path: Path, kind: str
) -> None:
    store, _, _ = exam(env, tmp_path, kind)
    chats = env.count()
    result = run_cli("answer", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    tool = {"llama_index": "LlamaIndex", "haystack": "Haystack"}[kind]
    assert f"built by {tool}" in said and "--embedding openai:MODEL" in said
    assert env.count() == chats and env.count("/embeddings") == 0


def test_a_stored_function_of_another_model_of_the_same_size_is_refused(
    env: FakeOpenAI, tmp_path: Path
) -> None:
    from chromadb.utils.embedding_functions import OpenAIEmbeddingFunction

    function = OpenAIEmbeddingFunction(
        model_name="small", api_key_env_var="OPENAI_API_KEY", api_base=env.base_url
    )
    store = raw_store(tmp_path / "store", function=function)
    env.responder = exam_writer
    assert run_cli("generate", "--chroma", str(store), "--out", "run").exit_code == 0
    env.embed = lambda text: hashed_embedding("another model " + text[::-1], DIM)
    refused = run_cli("answer", "--chroma", str(store), "--out", "run")
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert "are not the store's" in said and "--embedding openai:MODEL" in said
    assert env.count() == PARAGRAPHS  # the exam's calls only: no answer was paid for
    env.embed = None  # the store's own model
    accepted = run_cli("answer", "--chroma", str(store), "--out", "run")
    assert accepted.exit_code == 0, accepted.output
    assert {row["target_rank"] for row in read_csv(tmp_path / "run" / "answers.csv")} == {"1"}


@pytest.mark.parametrize(("kind", "blamed"), [("raw", False), ("langchain", True)])
def test_the_no_function_message_blames_langchain_only_for_its_stores(
    env: FakeOpenAI, tmp_path: Path, kind: str, blamed: bool
) -> None:
    import chromadb

    corpus = write_corpus(tmp_path / "corpus")
    if kind == "raw":
        store = tmp_path / "store"
        client = chromadb.PersistentClient(path=str(store))
        client.create_collection("notes", embedding_function=None).add(
            ids=["a"], documents=["text"], embeddings=[[1.0, 0.0]], metadatas=[{"title": "t"}]
        )
        chromadb.api.client.SharedSystemClient.clear_system_cache()
    else:
        store = langchain_store(tmp_path / "store", corpus)
    result = run_cli("run", "--chroma", str(store), "--out", "run")
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "has no embedding function stored with it" in said
    assert ("LangChain" in said) == blamed
    assert env.count() == 0  # run checks answer's inputs before generate pays for a call
    support.exam(tmp_path / "exam", 3)  # for answer: an exam it would answer
    for command in ("run", "answer"):  # a dry run says what the command would refuse
        dry = run_cli(command, "--chroma", str(store), "--out", "exam", "--dry-run")
        assert dry.exit_code == 2 and " ".join(dry.output.split()) == said, dry.output
    assert env.count() == 0 and env.count("/embeddings") == 0
