"""The endpoint's Batch API, through the openai SDK's `files` and `batches`.

Uploads, batch creation, polling and downloads are few and cheap next to the chat calls they
replace, and the SDK's own retry (with Retry-After) serves them; the project's retry layer
(client.py) is for chat calls. Result files are streamed to disk, never held whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from ragexam.config import Settings
from ragexam.errors import AuthError, EndpointError
from ragexam.io.atomic import write_error
from ragexam.llm.failures import describe

WINDOW = "24h"
TERMINAL = ("completed", "failed", "expired", "cancelled")
LIST_PAGE = 100


@dataclass(frozen=True)
class BatchView:
    """What the endpoint says of one batch, for the progress display and the merge."""

    id: str
    status: str
    total: int
    completed: int
    failed: int
    created_at: float
    expires_at: float | None
    output_file_id: str | None
    error_file_id: str | None
    errors: tuple[tuple[str, str, int | None], ...]  # (code, message, line) of a failed batch

    @property
    def ended(self) -> bool:
        """The batch will change no more."""
        return self.status in TERMINAL


def view_of(batch: Any) -> BatchView:
    """The Batch object as plain values."""
    counts = batch.request_counts
    errors = tuple(
        (str(item.code or ""), str(item.message or ""), item.line)
        for item in (batch.errors.data or [] if batch.errors else [])
    )
    return BatchView(
        batch.id,
        batch.status,
        int(counts.total) if counts else 0,
        int(counts.completed) if counts else 0,
        int(counts.failed) if counts else 0,
        float(batch.created_at),
        float(batch.expires_at) if batch.expires_at else None,
        batch.output_file_id,
        batch.error_file_id,
        errors,
    )


class BatchApi:
    """Files and batches at the endpoint of OPENAI_BASE_URL."""

    def __init__(self, settings: Settings) -> None:
        self.redact = settings.redact
        self.client = openai.AsyncOpenAI(
            api_key=settings.api_key().get_secret_value(),
            base_url=settings.openai_base_url,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
        )

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.client.close()

    async def upload(self, path: Path) -> str:
        """Upload a shard as a batch input file; its file id."""
        with path.open("rb") as handle:
            made = await self._call(
                self.client.files.create, file=(path.name, handle), purpose="batch"
            )
        return str(made.id)

    async def create(self, file_id: str, url: str, metadata: dict[str, str]) -> BatchView:
        """A batch of the uploaded file's requests."""
        made = await self._call(
            self.client.batches.create,
            input_file_id=file_id,
            endpoint=url,
            completion_window=WINDOW,
            metadata=metadata,
        )
        return view_of(made)

    async def retrieve(self, batch_id: str) -> BatchView:
        """The batch as the endpoint sees it now."""
        return view_of(await self._call(self.client.batches.retrieve, batch_id))

    async def find(self, file_id: str) -> BatchView | None:
        """The batch made of this input file, if one was made (its id was not recorded)."""
        page = await self._call(self.client.batches.list, limit=LIST_PAGE)
        while True:
            for batch in page.data:
                if batch.input_file_id == file_id:
                    return view_of(batch)
            if not page.has_next_page():
                return None
            page = await page.get_next_page()

    async def download(self, file_id: str, path: Path) -> None:
        """Stream a result file to `path` (under a `.part` name until it is whole)."""
        part = path.with_name(path.name + ".part")
        path.parent.mkdir(parents=True, exist_ok=True)
        content = self.client.files.with_streaming_response.content
        try:
            async with content(file_id) as response:
                with part.open("wb") as handle:
                    async for chunk in response.iter_bytes(1 << 20):
                        handle.write(chunk)
                    handle.flush()
                    os.fsync(handle.fileno())
        except openai.APIError as exc:
            raise self._failed(exc) from None
        except OSError as exc:
            raise write_error(path, exc, "; make room and rerun the same command") from None
        part.replace(path)

    async def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except openai.APIError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: openai.APIError) -> EndpointError | AuthError:
        reason = self.redact(describe(exc))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return AuthError(f"the endpoint refused the API key for its Batch API: {reason}")
        return EndpointError(f"the endpoint's Batch API failed: {reason}")
