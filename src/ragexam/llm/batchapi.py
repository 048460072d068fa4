"""The endpoint's Batch API, through the openai SDK's `files` and `batches`.

Uploads, polling and downloads are few and cheap next to the chat calls they replace, and the
SDK's own retry (with Retry-After) serves them; the project's retry layer (client.py) is for
chat calls. Making a batch is the one step that costs: the endpoint may have made it when the
reply is lost (a 502, a timeout, a dropped connection), so it is never retried blindly: after a
failure the batch is looked up by its input file, and only made again when none exists. Result
files are streamed to disk, never held whole.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
from pydantic import BaseModel

from ragexam.config import OPENAI_URL, Settings
from ragexam.errors import AuthError, EndpointError
from ragexam.io.atomic import write_error
from ragexam.llm.failures import describe
from ragexam.urls import mask_url

WINDOW = "24h"
# A failure after which a batch may exist all the same: its reply was lost, not refused.
UNSURE = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
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
    ended_at: float | None = None  # when it ended, as the endpoint says

    @property
    def ended(self) -> bool:
        """The batch will change no more."""
        return self.status in TERMINAL


def view_of(batch: Any) -> BatchView:
    """The Batch object as plain values. EndpointError when it lacks what ragexam goes by (its
    id, status, result files); counts, times and errors it cannot read are left out."""
    if not isinstance(batch, BaseModel):
        raise EndpointError(f"{API} answered with {_what(batch)}, not a batch")
    ident, status = getattr(batch, "id", None), getattr(batch, "status", None)
    if not isinstance(ident, str) or not ident:
        raise EndpointError(f"{API} answered with a batch without an id")
    if not isinstance(status, str) or not status:
        raise EndpointError(f"{API} answered with batch {ident} without a status")
    files = [getattr(batch, name, None) for name in ("output_file_id", "error_file_id")]
    if not all(isinstance(file, str | None) for file in files):
        raise EndpointError(f"{API} answered with batch {ident} whose result file ids are not text")
    counts = getattr(batch, "request_counts", None)
    return BatchView(
        ident,
        status.lower(),  # Together's API says COMPLETED
        _count(counts, "total"),
        _count(counts, "completed"),
        _count(counts, "failed"),
        _time(getattr(batch, "created_at", None)) or time.time(),
        _time(getattr(batch, "expires_at", None)) or None,
        files[0] or None,
        files[1] or None,
        _errors(getattr(batch, "errors", None)),
        _ended_at(batch),
    )


ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at")


def _ended_at(batch: Any) -> float | None:
    """When the batch ended, by the endpoint's clock (a rerun may collect it hours later)."""
    times = [_time(getattr(batch, name, None)) for name in ENDED_AT]
    known = [at for at in times if at]
    return max(known) if known else None


API = "the endpoint's Batch API"


def _what(value: Any) -> str:
    """What came instead of an object, in a few words."""
    if isinstance(value, str):
        return "a body that is not JSON" if value.strip() else "an empty body"
    return f"JSON of another shape ({type(value).__name__})"


def _count(counts: Any, name: str) -> int:
    value = getattr(counts, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _time(value: Any) -> float | None:
    """A Unix time, or None for anything else."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _errors(errors: Any) -> tuple[tuple[str, str, int | None], ...]:
    """(code, message, line) of each error of a failed batch that has them."""
    items = getattr(errors, "data", None)
    found = []
    for item in items if isinstance(items, list) else []:
        code, message = getattr(item, "code", None), getattr(item, "message", None)
        line = getattr(item, "line", None)
        found.append((str(code or ""), str(message or ""), line if isinstance(line, int) else None))
    return tuple(found)


class BatchApi:
    """Files and batches at the endpoint of OPENAI_BASE_URL."""

    def __init__(self, settings: Settings) -> None:
        self.redact = settings.redact
        self.retries, self.backoff = settings.max_retries, settings.retry_backoff
        self.client = openai.AsyncOpenAI(
            api_key=settings.api_key().get_secret_value(),
            base_url=settings.openai_base_url or OPENAI_URL,
            timeout=settings.timeout,
            max_retries=settings.max_retries,
        )
        self.where = mask_url(str(self.client.base_url))  # the endpoint, as the ledger keeps it

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.client.close()

    async def upload(self, path: Path) -> str:
        """Upload a shard as a batch input file; its file id."""
        with path.open("rb") as handle:
            made = await self._call(
                self.client.files.create, file=(path.name, handle), purpose="batch"
            )
        ident = getattr(made, "id", None) if isinstance(made, BaseModel) else None
        if not isinstance(ident, str) or not ident:
            what = "a file without an id" if isinstance(made, BaseModel) else _what(made)
            raise EndpointError(f"{API} answered the upload of {path.name} with {what}")
        return ident

    async def create(
        self, file_id: str, url: str, metadata: dict[str, str], skip: frozenset[str] = frozenset()
    ) -> BatchView:
        """A batch of the uploaded file's requests: made once, whatever its reply meets
        (`skip`: batches of the file that are not it, refused by a full queue)."""
        once: Any = self.client.with_options(max_retries=0).batches.create
        for attempt in range(self.retries + 1):
            try:
                made = await once(
                    input_file_id=file_id,
                    endpoint=url,
                    completion_window=WINDOW,
                    metadata=metadata,
                )
            except UNSURE as exc:  # made or not: the endpoint's list of batches says
                found = await self.find(file_id, skip)
                if found is not None:
                    return found
                if attempt == self.retries:
                    raise self._failed(exc) from None
                await asyncio.sleep(self.backoff * 2**attempt)
            except openai.APIError as exc:
                raise self._failed(exc) from None
            except json.JSONDecodeError:
                raise EndpointError(f"{API} answered with a body that is not JSON") from None
            else:
                return view_of(made)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    async def retrieve(self, batch_id: str) -> BatchView:
        """The batch as the endpoint sees it now."""
        return view_of(await self._call(self.client.batches.retrieve, batch_id))

    async def find(self, file_id: str, skip: frozenset[str] = frozenset()) -> BatchView | None:
        """The batch made of this input file, if one was made (its id was not recorded), but
        for those in `skip` (refused by a full queue)."""
        page = await self._call(self.client.batches.list, limit=LIST_PAGE)
        while True:
            batches = getattr(page, "data", None)
            if not isinstance(batches, list):
                raise EndpointError(f"{API} answered the list of batches with {_what(page)}")
            for batch in batches:
                if getattr(batch, "input_file_id", None) == file_id and batch.id not in skip:
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
        except json.JSONDecodeError:  # the SDK reads a JSON body it was told is JSON
            raise EndpointError(f"{API} answered with a body that is not JSON") from None

    def _failed(self, exc: openai.APIError) -> EndpointError | AuthError:
        reason = self.redact(describe(exc))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return AuthError(f"the endpoint refused the API key for its Batch API: {reason}")
        asked = exc.request.url.path.rstrip("/") if exc.request is not None else ""
        missing = getattr(exc, "status_code", None) in (404, 405, 501)
        if missing and asked.endswith(("/files", "/batches")):  # not one batch: the API itself
            return EndpointError(
                f"the endpoint has no Batch API ({reason}, at {asked}): write the requests "
                "with --batch-dir DIR instead, for an engine that reads batch files "
                "(vllm run-batch; docs/batch.md)"
            )
        if isinstance(exc, openai.APIConnectionError) and not isinstance(
            exc, openai.APITimeoutError
        ):  # nothing answered at that URL: the setting, or the server, as on the sync road
            return EndpointError(
                f"the endpoint's Batch API at {self.where.rstrip('/')} failed: {reason}; check "
                "OPENAI_BASE_URL and that it is up"
            )
        failed = EndpointError(f"the endpoint's Batch API failed: {reason}")
        failed.status = getattr(exc, "status_code", None)  # type: ignore[attr-defined]
        return failed
