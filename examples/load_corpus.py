"""Put the sample corpus into a Chroma store: one chunk per paragraph, `source` = file name.

    uv run python examples/load_corpus.py                      # Chroma's default embedding
    uv run python examples/load_corpus.py --embedding openai:text-embedding-3-small

Chroma's default embedding (all-MiniLM-L6-v2) is downloaded once, on first use. With
`openai:MODEL` the embeddings come from OPENAI_BASE_URL with OPENAI_API_KEY, read from the
environment or from `.env`, as ragexam reads them. Either way Chroma
stores the embedding function with the collection, so `ragexam answer` can reuse it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import chromadb
from chromadb.config import Settings
from chromadb.utils import embedding_functions

from ragexam.config import export_env_file, load_settings
from ragexam.errors import RagexamError

HERE = Path(__file__).parent


def chunks(corpus: Path) -> list[tuple[str, str, str]]:
    """(id, text, source) for every paragraph of every markdown file."""
    found = []
    for path in sorted(corpus.glob("*.md")):
        paragraphs = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
        for index, text in enumerate(p for p in paragraphs if p and not p.startswith("#")):
            found.append((f"{path.stem}-{index:02d}", " ".join(text.split()), path.name))
    return found


def embedding_function(spec: str) -> object:
    """Chroma's default embedding function, or OpenAI-compatible embeddings for openai:MODEL."""
    if spec == "default":
        return embedding_functions.DefaultEmbeddingFunction()
    try:
        export_env_file()  # .env's key where Chroma looks for it (the environment)
        settings = load_settings()
        settings.api_key()
    except RagexamError as exc:
        raise SystemExit(f"Error: {exc}") from None
    return embedding_functions.OpenAIEmbeddingFunction(
        model_name=spec.removeprefix("openai:"),
        api_key_env_var="OPENAI_API_KEY",
        api_base=settings.embedding_base_url or settings.openai_base_url,
    )


def main() -> None:
    """Load the corpus into --chroma, replacing the collection if it exists."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chroma", type=Path, default=HERE / "chroma")
    parser.add_argument("--collection", default="handbook")
    parser.add_argument("--corpus", type=Path, default=HERE / "corpus")
    parser.add_argument("--embedding", default="default", help="default or openai:MODEL")
    args = parser.parse_args()
    client = chromadb.PersistentClient(str(args.chroma), Settings(anonymized_telemetry=False))
    if args.collection in [c.name for c in client.list_collections()]:
        client.delete_collection(args.collection)
    collection = client.create_collection(
        args.collection,
        embedding_function=embedding_function(args.embedding),  # type: ignore[arg-type]
    )
    ids, texts, sources = zip(*chunks(args.corpus), strict=True)
    try:
        collection.add(
            ids=list(ids), documents=list(texts), metadatas=[{"source": s} for s in sources]
        )
    except Exception as exc:  # most often: no internet for the default model's first download
        client.delete_collection(args.collection)
        reason = " ".join(str(exc).split())[:200].rstrip(".")
        raise SystemExit(
            f"Error: could not embed the corpus with {args.embedding!r}: "
            f"{type(exc).__name__}: {reason}. The default model is downloaded once and needs "
            "internet; --embedding openai:MODEL uses your endpoint."
        ) from None
    print(
        f"{len(ids)} chunks from {len(set(sources))} documents -> {args.chroma} "
        f"(collection {args.collection!r})"
    )


if __name__ == "__main__":
    main()
