"""Read-only access to a Chroma store: open it, pick the collection, page through its chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ragexam.errors import AuthError, RagexamError, StoreError
from ragexam.store.deadline import DeadlineExceeded, call_with_deadline
from ragexam.store.snapshot import Snapshots
from ragexam.urls import mask_url, parse_http_url

# File names before ids: LlamaIndex's `doc_id` is a new uuid on every ingestion (one per page of
# a PDF), where `file_path` and `file_name` name the file; "None" is what it stores without one.
DEFAULT_DOC_KEYS = (
    "source",
    "document",
    "file_path",
    "file_name",
    "filename",
    "title",
    "doc_id",
)
NO_VALUE = (None, "", "None")
UNKNOWN_DOCUMENT = "(unknown)"
# A Chroma server's own defaults (chromadb.config's, named here so that naming them loads nothing)
DEFAULT_TENANT, DEFAULT_DATABASE = "default_tenant", "default_database"
PAGE_SIZE = 1000
NEAREST = 10  # neighbours looked at for one of another document


@dataclass(frozen=True)
class Chunk:
    """One record of the collection, with the name of its source document."""

    id: str
    text: str
    document: str
    metadata: Mapping[str, Any]


@dataclass(frozen=True)
class StoreRef:
    """Where the chunks live: a persist directory or a server URL, and a collection."""

    path: Path | None = None
    url: str | None = None
    collection: str | None = None
    # Told, in one line, when a persisted store is copied to be read (the CLI prints it).
    notify: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    timeout: float = 60.0  # seconds any one store call may take (RAGEXAM_STORE_TIMEOUT)
    tenant: str | None = None  # a Chroma server's tenant and database; its defaults when None
    database: str | None = None
    token: str | None = field(default=None, repr=False)  # CHROMA_API_KEY; never shown
    # The command's snapshots of persisted stores: its stages read one copy.
    snapshots: Snapshots = field(default_factory=Snapshots, compare=False, repr=False)

    def describe(self) -> str:
        """A short human name for the store, for messages and the manifest."""
        return str(self.path) if self.path is not None else mask_url(str(self.url))


def _client_settings() -> Any:
    from chromadb.config import Settings

    # validate, not apply: opening an older store must never migrate it in place.
    return Settings(anonymized_telemetry=False, allow_reset=False, migrations="validate")


def open_client(ref: StoreRef) -> Any:
    """A Chroma client for the store, refusing to create one that does not exist."""
    if ref.url is not None:
        try:
            parts = parse_http_url(ref.url, "--chroma-url")
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        port = parts.port or (443 if parts.scheme == "https" else 8000)
        connect = partial(_connect, ref, parts.hostname or "", port, parts.scheme == "https")
        try:
            return TimedStore(call_with_deadline(connect, ref.timeout), ref)
        except DeadlineExceeded:
            raise _stalled(ref, "to a connection") from None
        except Exception as exc:
            raise _refused(ref, exc) from None
    return TimedStore(_open_persistent(ref.path or Path(), ref.notify, ref.snapshots), ref)


def _connect(ref: StoreRef, host: str, port: int, ssl: bool) -> Any:
    """An HTTP client; a token goes in both headers Chroma servers read (self-hosted, Cloud)."""
    import chromadb

    token = ref.token or ""
    return chromadb.HttpClient(
        host=host,
        port=port,
        ssl=ssl,
        headers={"Authorization": f"Bearer {token}", "X-Chroma-Token": token} if token else None,
        tenant=ref.tenant or DEFAULT_TENANT,
        database=ref.database or DEFAULT_DATABASE,
        settings=_client_settings(),
    )


def _refused(ref: StoreRef, exc: Exception) -> RagexamError:
    """One line for a server that cannot be reached (2) or refuses the token (4), token masked."""
    reason = mask_url(" ".join(str(exc).split()))[:300]
    if ref.token:
        reason = reason.replace(ref.token, "***")
    if any(word in reason.lower() for word in ("forbidden", "unauthorized", "authenticat")):
        return AuthError(
            f"the Chroma server at {ref.describe()} refused the request ({reason}): "
            + ("check CHROMA_API_KEY" if ref.token else "it needs a token: set CHROMA_API_KEY")
        )
    return StoreError(f"cannot reach the Chroma server at {ref.describe()}: {reason}")


class TimedStore:
    """A Chroma client or collection whose every call has a deadline (RAGEXAM_STORE_TIMEOUT)."""

    def __init__(self, target: Any, ref: StoreRef) -> None:
        self._target, self._ref = target, ref

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                result = call_with_deadline(partial(value, *args, **kwargs), self._ref.timeout)
            except DeadlineExceeded:
                raise _stalled(self._ref, f"to {name}()") from None
            return TimedStore(result, self._ref) if name == "get_collection" else result

        return timed


def _stalled(ref: StoreRef, what: str) -> StoreError:
    return StoreError(
        f"the Chroma store at {ref.describe()} did not answer {what} within {ref.timeout:g}s; "
        "check that it is up, or raise RAGEXAM_STORE_TIMEOUT"
    )


def _open_persistent(path: Path, notify: Callable[[str], None] | None, snapshots: Snapshots) -> Any:
    """A client of a private snapshot of the store: Chroma writes to any store it opens."""
    import chromadb

    if not path.is_dir():
        what = "a file, not a store's folder" if path.exists() else "the directory does not exist"
        raise StoreError(f"no Chroma store at {path}: {what}")
    if not (path / "chroma.sqlite3").is_file():
        raise StoreError(f"no Chroma store at {path}: it holds no chroma.sqlite3")
    problem = _not_sqlite(path / "chroma.sqlite3")
    if problem:  # else Chroma finds no tables, and says they need a migration
        raise StoreError(f"no Chroma store at {path}: its chroma.sqlite3 {problem}")
    snapshot, fresh = snapshots.of(path)
    if fresh and notify is not None:
        notify(snapshot.describe())
    try:
        return chromadb.PersistentClient(path=str(snapshot.path), settings=_client_settings())
    except ValueError as exc:
        if "already exists" not in str(exc):
            raise StoreError(f"cannot open the Chroma store at {path}: {exc}") from None
        # A --rag module in this process opened the store first, with its own settings;
        # Chroma allows one client configuration per path, so share that one.
        return chromadb.PersistentClient(
            path=str(snapshot.path), settings=_settings_in_use(snapshot.path)
        )
    except Exception as exc:
        if "migration" in str(exc).lower():
            raise StoreError(
                f"the Chroma store at {path} was written by an older Chroma; ragexam never "
                "migrates a store: upgrade a copy of the folder by opening it once with this "
                "version of chromadb, and point --chroma at the copy"
            ) from None
        raise StoreError(f"cannot open the Chroma store at {path}: {exc}") from None


def _not_sqlite(path: Path) -> str | None:
    """What is wrong with a file that should be a SQLite database, if anything."""
    try:
        with path.open("rb") as handle:
            head = handle.read(16)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not head:
        return "is empty (0 bytes)"
    return None if head == b"SQLite format 3\x00" else "is not a SQLite database"


def _systems() -> dict[str, Any]:
    """Chroma's per-process clients by path (private, hence the defensive getattr)."""
    from chromadb.api.shared_system_client import SharedSystemClient

    systems: dict[str, Any] = getattr(SharedSystemClient, "_identifier_to_system", {})
    return systems


def release(ref: StoreRef | None) -> None:
    """Close ragexam's own client of a persisted store, so later code may open it its own way."""
    if ref is None or ref.path is None:
        return
    opened = str(ref.snapshots.existing(ref.path))
    system = _systems().get(opened)
    if system is not None and _is_ours(system.settings):
        _systems().pop(opened, None)
        system.stop()


def _is_ours(settings: Any) -> bool:
    """A client opened by ragexam, not by a --rag module (Chroma adds the path to settings)."""
    ours = _client_settings()
    fields = ("anonymized_telemetry", "allow_reset", "migrations")
    return all(getattr(settings, name, None) == getattr(ours, name) for name in fields)


def _settings_in_use(path: Path) -> Any:
    system = _systems().get(str(path))
    if system is None:
        raise StoreError(f"cannot open the Chroma store at {path}: another client holds it")
    return system.settings


def open_collection(ref: StoreRef) -> Any:
    """The named collection, or the only one; never created, and never empty."""
    client = open_client(ref)
    names = sorted(_name(item) for item in client.list_collections())
    if not names:  # nothing to choose from
        raise StoreError(
            f"{ref.describe()} holds no collection: is it the store your chunks were loaded into?"
        )
    if ref.collection is None:
        if len(names) != 1:
            found = ", ".join(names) if names else "none"
            raise StoreError(
                f"{ref.describe()} holds {len(names)} collections ({found}): "
                "choose one with --collection"
            )
        name = names[0]
    elif ref.collection not in names:
        found = ", ".join(names) if names else "none"
        raise StoreError(f"no collection {ref.collection!r} in {ref.describe()}; it holds: {found}")
    else:
        name = ref.collection
    collection = client.get_collection(name)
    if collection.count() == 0:
        raise StoreError(f"collection {name!r} in {ref.describe()} is empty: nothing to evaluate")
    return collection


def _name(item: Any) -> str:
    return item if isinstance(item, str) else str(item.name)


def document_of(metadata: Mapping[str, Any] | None, doc_key: str | None) -> str:
    """The source document of a chunk: its `doc_key` field, else the first default key present."""
    metadata = metadata or {}
    for key in (doc_key,) if doc_key else DEFAULT_DOC_KEYS:
        value = metadata.get(key)
        if value not in NO_VALUE:
            return str(value)
    return UNKNOWN_DOCUMENT


def iter_chunks(
    collection: Any, doc_key: str | None = None, page_size: int = PAGE_SIZE, texts: bool = True
) -> Iterator[Chunk]:
    """Every chunk of the collection, one page in memory at a time (without texts: "" each)."""
    offset = 0
    include = ["documents", "metadatas"] if texts else ["metadatas"]
    while True:
        page = collection.get(limit=page_size, offset=offset, include=include)
        ids = page["ids"]
        texts_of_page = page["documents"] or [""] * len(ids)
        for index, chunk_id in enumerate(ids):
            metadata = (page["metadatas"] or [])[index] or {}
            text = texts_of_page[index] or ""
            yield Chunk(chunk_id, text, document_of(metadata, doc_key), metadata)
        if len(ids) < page_size:
            return
        offset += page_size


def check_doc_key(collection: Any, doc_key: str | None) -> str | None:
    """The field that names documents: `doc_key`, else the first default key the first page
    has (None when its chunks have no metadata); stop before any call when they lack it."""
    page = collection.get(limit=PAGE_SIZE, include=["metadatas"])
    metadatas = [meta or {} for meta in page["metadatas"] or []]
    keys = (doc_key,) if doc_key else DEFAULT_DOC_KEYS
    found = [key for key in keys if any(meta.get(key) not in NO_VALUE for meta in metadatas)]
    if found:
        return found[0]
    present = sorted(
        {key for meta in metadatas for key, value in meta.items() if _user_field(key, value)}
    )
    if doc_key:
        raise StoreError(
            f"no chunk has the metadata field {doc_key!r} given by --doc-key; "
            f"fields present: {', '.join(present) or 'none'}"
        )
    texts = [key for key in present if any(isinstance(meta.get(key), str) for meta in metadatas)]
    if not present:  # without any field, every chunk is one unknown document
        return None
    raise StoreError(
        f"no chunk has a metadata field that names its document ({', '.join(keys)}), so "
        f"every chunk would be {UNKNOWN_DOCUMENT}; fields present: {', '.join(present)}: "
        f"pass --doc-key FIELD, e.g. --doc-key {(texts or present)[0]}"
    )


def _user_field(key: str, value: Any) -> bool:
    """A field the user could name documents by: not a framework's own (LlamaIndex's
    `_node_content`), and not its "None" for a node made without a document."""
    return not key.startswith("_") and value not in NO_VALUE


def get_chunks(collection: Any, ids: list[str]) -> dict[str, str]:
    """The texts of the chunks with these ids (those that exist)."""
    if not ids:
        return {}
    unique = list(dict.fromkeys(ids))  # Chroma rejects a repeated id
    found = collection.get(ids=unique, include=["documents"])
    return dict(zip(found["ids"], [text or "" for text in found["documents"] or []], strict=True))


def nearest_elsewhere(
    collection: Any, ids: list[str], doc_key: str | None, among: int = NEAREST
) -> dict[str, str]:
    """For each chunk, the nearest chunk of another document by the store's own vectors (among
    its `among` nearest; a chunk without one is left out). One get and one query call."""
    if not ids:
        return {}
    stored = collection.get(ids=ids, include=["embeddings", "metadatas"])
    vectors = stored.get("embeddings")
    if vectors is None or not len(vectors):
        return {}
    metadatas = stored["metadatas"] or [None] * len(stored["ids"])
    own = {i: document_of(m, doc_key) for i, m in zip(stored["ids"], metadatas, strict=True)}
    found = collection.query(
        query_embeddings=[list(map(float, vector)) for vector in vectors],
        n_results=min(among + 1, collection.count()),
        include=["metadatas"],
    )
    partners = {}
    for chunk_id, near, metadatas in zip(
        stored["ids"], found["ids"], found["metadatas"] or [], strict=True
    ):
        other = (
            n
            for n, m in zip(near, metadatas, strict=True)
            if document_of(m, doc_key) != own[chunk_id]
        )
        partner = next(other, None)
        if partner is not None:
            partners[chunk_id] = partner
    return partners


def existing_ids(collection: Any, ids: list[str]) -> set[str]:
    """Those of `ids` that are records of the collection, looked up a page at a time."""
    unique, found = list(dict.fromkeys(ids)), set()
    for start in range(0, len(unique), PAGE_SIZE):
        page = collection.get(ids=unique[start : start + PAGE_SIZE], include=[])
        found.update(page["ids"])
    return found
