"""LLM access: ChatOpenAI with a timeout, structured output, and the project's one retry layer.

Retries live here and only here: the openai SDK runs with max_retries=0, so the number of
HTTP calls per row is at most `max_retries + 1`, whatever fails. 429, 5xx, timeouts,
connection errors and invalid output are retried with backoff; `Retry-After` is honoured
and pauses every worker, not just the one that was told. 400, 401, 403 and 404 are not
retried, except that a refusal of any status naming the structured-output method's fields
switches to the next method (json_schema or function_calling, then json_mode, then prompt)
and retries without using up a retry (see structured.MethodChoice). Every call is bounded
by max_tokens.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import openai
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from ragexam.config import Settings, StructuredMethod, SystemRole
from ragexam.endpoint import ModelCheck, ReplyBound, root_cause
from ragexam.errors import AuthError, LLMError, OutputError
from ragexam.prompts import system_as_user
from ragexam.replies import InvalidReply, NoAnswer, check_reply
from ragexam.structured import (
    CUT_OFF,
    MethodChoice,
    MethodRefused,
    content_of,
    output_error,
    parse_structured,
    reask,
    with_schema,
)
from ragexam.transport import async_http_client

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.ConflictError,
    OutputError,
    InvalidReply,
)
MAX_RETRY_AFTER = 120.0


@dataclass(frozen=True)
class Reply(Generic[T]):
    """A successful call: the value, what it cost, and how many HTTP calls it took."""

    value: T
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    latency: float
    raw: str

    def cost(self) -> dict[str, Any]:
        """The per-row columns every stage records about its call."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "attempts": self.attempts,
            "latency_s": round(self.latency, 3),
        }


class RateGate:
    """A shared pause: after a 429, no worker sends until the server's wait is over."""

    def __init__(self) -> None:
        self._until = 0.0

    def hold(self, seconds: float) -> None:
        """Pause every sender for `seconds` from now."""
        self._until = max(self._until, time.monotonic() + seconds)

    async def wait(self) -> None:
        """Sleep until the pause, if any, is over."""
        # A loop, not an Event: another 429 may push the deadline while we sleep.
        while (delay := self._until - time.monotonic()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(delay)


class LLM:
    """One chat model for one stage, with its retry policy and running totals."""

    def __init__(
        self,
        settings: Settings,
        model: str,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens or settings.max_tokens_for("answer")
        self.chat = ChatOpenAI(
            model=model,
            api_key=settings.api_key(),
            base_url=settings.openai_base_url,
            timeout=settings.timeout,
            max_retries=0,
            temperature=temperature,
            # Our own client: langchain-openai's shared default is bound to the first event
            # loop, and would break the next stage's asyncio.run in the same process.
            http_async_client=async_http_client(event_hooks={"response": [check_reply]}),
        )
        self.bound = ReplyBound(settings.openai_base_url, self.max_tokens)
        self.chat.extra_body = self.bound.body()
        self.choice = MethodChoice(settings.structured_output)
        self.system_as_user = settings.system_prompt == SystemRole.user
        self.model_check = ModelCheck(model, settings.openai_base_url)
        self.max_retries = settings.max_retries
        self.backoff = settings.retry_backoff
        self.redact = settings.redact
        self.gate = RateGate()
        self.calls = 0
        self.tokens = [0, 0]  # prompt and completion tokens of every call, failed ones too
        self._runnables: dict[tuple[type[BaseModel], StructuredMethod], Runnable[Any, Any]] = {}

    async def aclose(self) -> None:
        """Close the HTTP connections of this model."""
        client = self.chat.http_async_client
        if client is not None:
            await client.aclose()

    @property
    def method(self) -> StructuredMethod:
        """The structured-output method in use now."""
        return self.choice.method

    async def structured(self, messages: list[BaseMessage], schema: type[M]) -> Reply[M]:
        """Ask for an instance of `schema`; invalid replies are re-asked with the reason."""
        conversation = list(messages)

        async def once() -> tuple[M, AIMessage]:
            async with self.choice.attempt() as method:
                runnable = self._structured_runnable(schema, method)
                raw = await runnable.ainvoke(self._shape(with_schema(conversation, schema, method)))
            assert isinstance(raw, AIMessage)
            try:
                return parse_structured(raw, schema), raw
            except OutputError as exc:
                conversation[:] = reask(messages, exc)
                raise

        return await self._retrying(once)

    async def text(self, messages: list[BaseMessage]) -> Reply[str]:
        """Ask for plain text; a reply cut off at max_tokens is re-asked, shorter."""
        conversation = list(messages)

        async def once() -> tuple[str, AIMessage]:
            raw = await self.chat.ainvoke(self._shape(conversation))
            assert isinstance(raw, AIMessage)
            if raw.response_metadata.get("finish_reason") == "length":
                exc = output_error(CUT_OFF, raw)
                conversation[:] = reask(messages, exc)
                raise exc
            return content_of(raw), raw

        return await self._retrying(once)

    def _shape(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        return system_as_user(messages) if self.system_as_user else messages

    def _structured_runnable(
        self, schema: type[BaseModel], method: StructuredMethod
    ) -> Runnable[Any, Any]:
        key = (schema, method)
        if key not in self._runnables:  # built once per schema and method, not per call
            self._runnables[key] = self._build_runnable(schema, method)
        return self._runnables[key]

    def _build_runnable(
        self, schema: type[BaseModel], method: StructuredMethod
    ) -> Runnable[Any, Any]:
        """The chat model bound to the method's request fields; replies are parsed by us.

        Binding directly, rather than through with_structured_output(include_raw=True), keeps
        the raw reply for tolerant parsing and saves ~5 ms of CPU per call. response_format
        goes in extra_body: as a top-level field it sends the call through the SDK's parse()
        path, ~1 ms more per call, for parsing we do not use.
        """
        if method == StructuredMethod.prompt:
            return self.chat
        if method == StructuredMethod.function_calling:
            return self.chat.bind_tools([schema], tool_choice=schema.__name__)
        extra = self.bound.body()  # a bound extra_body replaces the model's
        if method == StructuredMethod.json_mode:
            return self.chat.bind(extra_body={**extra, "response_format": {"type": "json_object"}})
        spec = {"name": schema.__name__, "schema": schema.model_json_schema()}
        format_ = {"type": "json_schema", "json_schema": spec}
        return self.chat.bind(extra_body={**extra, "response_format": format_})

    async def _retrying(self, once: Callable[[], Awaitable[tuple[T, AIMessage]]]) -> Reply[T]:
        started, tokens, reason, raw_text = time.monotonic(), [0, 0], "no attempt made", None
        await self.model_check.once(self.chat.root_async_client)
        attempt = 0
        while attempt <= self.max_retries:
            attempt += 1
            await self.gate.wait()
            self.calls += 1
            try:
                value, raw = await once()
            except MethodRefused as exc:
                reason = self.redact(describe(exc.__cause__ or exc))
                attempt -= 1  # the refused method's fault, not the row's: the retry is free
                continue
            except Exception as exc:
                if self._bound_refused(exc):
                    reason, attempt = self.redact(describe(exc)), attempt - 1  # free, as above
                    continue
                self._count(tokens, getattr(exc, "raw_message", None))
                reason, delay = self._failure(exc, attempt, tokens)
                raw_text = getattr(exc, "raw", None) or raw_text
                if attempt <= self.max_retries:
                    await asyncio.sleep(delay)
                continue
            self._count(tokens, raw)
            latency = time.monotonic() - started
            return Reply(value, tokens[0], tokens[1], attempt, latency, content_of(raw))
        attempts = self.max_retries + 1
        raise LLMError(
            f"{reason} (after {attempts} attempts)",
            attempts=attempts,
            raw=raw_text,
            tokens=(tokens[0], tokens[1]),
        )

    def _bound_refused(self, exc: Exception) -> bool:
        """Whether a 400 refused the reply bound's field; the first one switches it."""
        field = self.bound.field
        if not self.bound.refused(exc):
            return False
        if self.bound.field != field:
            self.chat.extra_body = self.bound.body()
            self._runnables.clear()  # they carry the old field
        return True

    def _count(self, tokens: list[int], raw: AIMessage | None) -> None:
        """Add one attempt's usage to the row's tokens and to this model's totals."""
        usage = raw.usage_metadata if raw is not None else None
        if usage:
            for index, used in enumerate((usage["input_tokens"], usage["output_tokens"])):
                tokens[index] += used
                self.tokens[index] += used

    def _failure(self, exc: Exception, attempt: int, tokens: list[int]) -> tuple[str, float]:
        """What one failed attempt means: its reason and the wait before the next, or raise."""
        reason = self.redact(describe(exc))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            raise AuthError(f"the endpoint refused the API key: {reason}") from None
        if isinstance(exc, NoAnswer):  # asking again would pay for the same refusal
            raise LLMError(reason, attempts=attempt, tokens=(tokens[0], tokens[1])) from None
        if not isinstance(exc, RETRYABLE):
            if isinstance(exc, openai.APIError):
                raise LLMError(reason, attempts=attempt, tokens=(tokens[0], tokens[1])) from None
            raise exc  # not an API failure: a bug, keep its traceback
        waited = retry_after(exc)
        if waited is not None:
            self.gate.hold(waited)  # the server said how long: everyone waits
            return reason, 0.0
        return reason, self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed call."""
    if isinstance(exc, openai.APIStatusError):
        message = exc.message
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            message = body["message"]
        text = f"HTTP {exc.status_code}: {message}"
    elif isinstance(exc, openai.APITimeoutError):
        text = "the call timed out (RAGEXAM_TIMEOUT)"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"cannot connect to the endpoint: {root_cause(exc)}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:500]


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms), if it said."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return min(max(float(value) * scale, 0.0), MAX_RETRY_AFTER)
            except ValueError:
                continue  # an HTTP date: rare from LLM servers, fall back to backoff
    return None
