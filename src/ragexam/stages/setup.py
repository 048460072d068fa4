"""What a command's options become below the API: settings, the store, the run folder.

The settings a stage runs with are read here once, from its options (flags win), the
environment and `.env` (config.py is their only reader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from ragexam.config import Settings, Stage, load_settings
from ragexam.errors import ConfigError
from ragexam.io.runfolder import Identity
from ragexam.options import Given
from ragexam.stages.session import Session
from ragexam.store.chroma import DEFAULT_DATABASE, DEFAULT_TENANT, StoreRef


def settings_for(given: Given, *stages: Stage) -> Settings:
    """The settings of these stages: each one's model is --model, when given."""
    calls, store = given.calls, given.store
    models: dict[str, Any] = {f"{stage}_model": calls.model for stage in stages}
    settings = load_settings(
        concurrency=calls.concurrency,
        max_error_rate=calls.max_error_rate,
        rpm=calls.rpm,
        tpm=calls.tpm,
        structured_output=calls.structured_output,
        embedding=given.answering.embedding,
        chroma_tenant=store.chroma_tenant,
        chroma_database=store.chroma_database,
        **models,
    )
    if calls.batch_dir is not None and not (settings.openai_api_key or settings.openai_base_url):
        # --batch-dir sends no chat call: the requests it writes need no key (vLLM's run-batch
        # reads them offline). Retrieval through an endpoint still needs one, and says so.
        settings = settings.model_copy(update={"openai_api_key": SecretStr(NO_KEY)})
    return settings


NO_KEY = "not-needed-for-batch-dir"


def store_ref(given: Given, settings: Settings, session: Session) -> StoreRef:
    """The store the options point at: exactly one of --chroma and --chroma-url."""
    store = given.store
    if (store.chroma is None) == (store.chroma_url is None):
        raise ConfigError("give exactly one of --chroma PATH and --chroma-url URL")
    server: dict[str, Any] = {}
    if store.chroma_url is not None:  # where on the server, and its token
        key = settings.chroma_api_key.get_secret_value() if settings.chroma_api_key else None
        server = {"tenant": settings.chroma_tenant, "database": settings.chroma_database}
        server["token"] = key or None
    return StoreRef(
        Path(store.chroma) if store.chroma is not None else None,
        store.chroma_url,
        store.collection,
        notify=session.observer.note,
        snapshots=session.snapshots,
        timeout=settings.store_timeout,
        **server,
    )


def identity(ref: StoreRef, collection: Any) -> Identity:
    """The store and collection as a run folder records them: a folder's absolute path, or a
    server's address (scheme, host, port) with its tenant and database, defaults named."""
    if ref.path is not None:
        return Identity(str(ref.path.resolve()), str(collection.name))
    parts = urlsplit(ref.url or "")
    host = "127.0.0.1" if parts.hostname == "localhost" else (parts.hostname or "")
    port = parts.port or (443 if parts.scheme == "https" else 8000)
    tenant, database = ref.tenant or DEFAULT_TENANT, ref.database or DEFAULT_DATABASE
    where = f"{parts.scheme}://{host}:{port} (tenant {tenant}, database {database})"
    return Identity(where, str(collection.name))
