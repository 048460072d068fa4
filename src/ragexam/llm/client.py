"""LLM access: ChatOpenAI with a timeout, structured output, and the project's one retry layer.

Retries live here and only here: the openai SDK runs with max_retries=0. 5xx, timeouts,
connection errors and invalid output are retried with backoff, at most `max_retries` times
per row. A 429 means "not now": it is retried after the server's `Retry-After` (else a
backoff) until the row has waited `rate_limit_wait` seconds in all, does not count against
`max_retries`, and narrows the pacer's window of calls in flight (pacing.py). When the first
calls of a stage all fail to reach the endpoint, the stage stops (endpoint.Reachability).
400, 401, 403 and 404 are not retried, except that a refusal of any status naming the
structured-output method's fields switches to the next method (json_schema or
function_calling, then json_mode, then prompt) and retries without using up a retry (see
structured.MethodChoice). Every call is bounded by max_tokens.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import openai
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.runnables import Runnable
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from ragexam.config import OPENAI_URL, Settings, StructuredMethod, SystemRole
from ragexam.errors import AuthError, LLMError, LocalClientError, OutputError
from ragexam.io.batchfiles import Answer
from ragexam.llm import deferred
from ragexam.llm.endpoint import (
    EndpointMemory,
    ModelCheck,
    Reachability,
    ReplyBound,
    SystemCheck,
    endpoint_key,
    local_failure,
)
from ragexam.llm.failures import describe, rate_limited, retry_after
from ragexam.llm.pacing import Pacer, estimate_tokens
from ragexam.llm.prompts import Call, system_as_user
from ragexam.llm.replies import InvalidReply, NoAnswer, check_reply
from ragexam.llm.requests import Form, Rendered, Requests
from ragexam.llm.structured import (
    CUT_OFF,
    MethodChoice,
    MethodRefused,
    content_of,
    cut_off,
    lone_surrogate,
    parse_structured,
    reask,
    schema_tokens,
    tolerant_json,
    with_schema,
)
from ragexam.llm.timing import CallClock
from ragexam.llm.transport import async_http_client, client_kind

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

RETRYABLE = (
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.ConflictError,
    OutputError,
    InvalidReply,
    deferred.Unanswered,  # a batch line that never ran
)
MAX_RATE_LIMIT_BACKOFF = 60.0


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


@dataclass
class _Row:
    """What one row's calls have cost and met so far."""

    started: float
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    calls: int = 0
    failures: int = 0  # failed attempts other than 429s: these count against max_retries
    limited: int = 0
    waited: float = 0.0  # seconds waited on 429s
    reason: str = "no attempt made"
    raw: str | None = None
    # prompt tokens sent, estimated, and without system text: measured when first needed
    measure: Callable[[], tuple[int, int]] = lambda: (0, 0)
    _sizes: tuple[int, int] | None = None

    def sizes(self) -> tuple[int, int]:
        """The prompt's estimated tokens (a batch line needs them only for the first calls)."""
        if self._sizes is None:
            self._sizes = self.measure()
        return self._sizes

    def error(self, reason: str) -> LLMError:
        """The row failed for good."""
        tokens = (self.tokens[0], self.tokens[1])
        return LLMError(reason, attempts=self.calls, raw=self.raw, tokens=tokens)


class LLM:
    """One chat model for one stage, with its retry policy and running totals."""

    def __init__(
        self,
        settings: Settings,
        model: str,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        memory: EndpointMemory | None = None,
    ) -> None:
        self.model = model
        self.memory = memory or EndpointMemory()
        self.max_tokens = max_tokens or settings.max_tokens_for("answer")
        self.chat = ChatOpenAI(
            model=model,
            api_key=settings.api_key(),
            base_url=settings.openai_base_url or OPENAI_URL,
            timeout=settings.timeout,
            max_retries=0,
            temperature=temperature,
            # Our own client: langchain-openai's shared default is bound to the first event
            # loop, and would break the next stage's asyncio.run in the same process.
            http_async_client=async_http_client(event_hooks={"response": [check_reply]}),
        )
        self.http = client_kind(self.chat.http_async_client)
        self.bound = ReplyBound(settings.openai_base_url, self.max_tokens)
        self.chat.extra_body = self.bound.body()
        self.choice = MethodChoice(settings.structured_output)
        self.system_as_user = settings.system_prompt == SystemRole.user
        self.model_check = ModelCheck(model, settings.openai_base_url, memory)
        self.system_check = SystemCheck(settings.openai_base_url, self.memory)
        self.max_retries = settings.max_retries
        self.backoff = settings.retry_backoff
        self.redact = settings.redact
        self.key = endpoint_key(model, settings.openai_base_url)
        self.sized = settings.max_tokens is None  # else RAGEXAM_MAX_TOKENS bounds every reply
        self.clock = CallClock(settings.timeout, self.key, self.memory)
        known = self.memory.rate(self.key)
        sends = self.memory.sends_of(self.key)
        self.pacer = Pacer(settings.concurrency, settings.rpm, settings.tpm, known, sends)
        self.rate_limit_wait = settings.rate_limit_wait
        self.reachability = Reachability(settings.openai_base_url, self.redact, model)
        self.tokens = [0, 0]  # prompt and completion tokens of every call, failed ones too
        # batch results of requests asked of another model, billed at its price: model ->
        # [calls, prompt, completion]
        self.elsewhere: dict[str, list[int]] = {}
        self.requests = Requests(settings.openai_base_url)  # what each call sends, as bytes
        self._runnables: dict[tuple[type[BaseModel], StructuredMethod], Runnable[Any, Any]] = {}
        self._forms: dict[tuple[Any, ...], Form | None] = {}  # a first call's request, by shape

    @property
    def calls(self) -> int:
        """HTTP calls made so far, failed ones included."""
        return self.pacer.traffic.calls

    def figures(self) -> dict[str, Any]:
        """For the manifest: calls made, the structured-output method used in the end, the
        HTTP client, and the tokens billed."""
        return {
            "calls": self.calls,
            "structured_output": self.method.value,
            "http_client": self.http,
            "tokens_billed": {"prompt": self.tokens[0], "completion": self.tokens[1]},
            **({"billed_elsewhere": self.billed_elsewhere()} if self.elsewhere else {}),
        }

    def billed_elsewhere(self) -> dict[str, dict[str, Any]]:
        """The results of requests asked of other models, by model, as verification roles are
        recorded: each is priced at its own model's rate."""
        return {
            model: {
                "model": model,
                "calls": calls,
                "tokens_billed": {"prompt": prompt, "completion": completion},
            }
            for model, (calls, prompt, completion) in self.elsewhere.items()
        }

    async def aclose(self) -> None:
        """Keep what was learned of the endpoint's rate; close the model's connections."""
        learned = self.pacer.learned
        self.memory.learned(self.key, learned.rate, learned.span)
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

        limit = self.limit(schema)

        async def once() -> tuple[M, AIMessage]:
            async with self.choice.attempt() as method:
                runnable = self._structured_runnable(schema, method)
                shaped = self._sent(conversation, schema, method)
                raw = await self._send(runnable, shaped, (schema, method), limit)
            assert isinstance(raw, AIMessage)
            batch = deferred.current()  # a batch result read again by a replayed row: booked once
            booked = batch is None or batch.fresh
            try:
                value = parse_structured(raw, schema, limit)
            except OutputError as exc:
                cut = CUT_OFF in exc.reason  # re-asked shorter: not the method's fault
                if not cut and booked and self.choice.outcome(method, valid=False):
                    conversation[:] = messages  # the next method starts afresh
                    raise MethodRefused(exc.reason) from exc
                conversation[:] = reask(messages, exc)
                raise
            if booked:
                self.choice.outcome(method, valid=True)
            return value, raw

        return await self._retrying(once, partial(self._sizes, messages))

    def _sent(
        self, messages: list[BaseMessage], schema: type[BaseModel], method: StructuredMethod
    ) -> list[BaseMessage]:
        """The messages a structured call sends under `method`."""
        return self._shape(with_schema(messages, schema, method))

    def request_of(self, call: Call, body: bool = True) -> Rendered | None:
        """The request of the call's first attempt now, as `structured` would send it on the
        batch road, rendered from the call's values (without its body, for its digest alone);
        None: build it the whole way (the first call of all, which looks the model up, a form
        not learned yet, or a shape no form renders exactly)."""
        form = self._forms.get(self._form_key(call)) if self.model_check.done else None
        if form is None:
            return None
        try:
            return form.render(call.values, body)
        except UnicodeEncodeError:
            return None  # the stack fails on it too: let the whole way meet it
        except KeyError:
            call.prompt.filled(call.values)  # the prompt's own error for the value missing
            raise

    def learns(self, call: Call) -> bool:
        """Whether `request_of` would render the call once its form is learned."""
        return self.model_check.done and self._form_key(call) not in self._forms

    async def learn(self, call: Call) -> None:
        """Learn the form of the call's first request now, from the stack itself."""
        method, schema, prompt = self.choice.method, call.schema, call.prompt
        key = self._form_key(call)  # as it is now, whatever happens while the form is learned
        if not prompt.plain:  # a field with a format spec ({answer:.100}) is not a gap
            self._forms[key] = None
            return

        def make(values: Mapping[str, str]) -> list[BaseMessage]:
            return self._sent(Call(prompt, values, schema).messages(), schema, method)

        runnable = self._structured_runnable(schema, method)
        self._forms[key] = await self.requests.learn(runnable, make, prompt.variables)

    def _form_key(self, call: Call) -> tuple[Any, ...]:
        """What a call's first request depends on beside its values."""
        return (call.prompt, call.schema, self.choice.method, self.bound.field, self.system_as_user)

    def read_first(self, call: Call, url: str, answer: Answer) -> Reply[Any] | None:
        """The reply of the call's first attempt, read from its batch result without the HTTP
        stack and langchain's reader; None where the whole way could read it otherwise (a
        failure, a refusal, a tool call, a cut-off reply, one that does not validate, a reply
        the system-message check still wants to see)."""
        if (
            answer.status != 200
            or not isinstance(answer.body, dict)
            or not self.reads_directly(url)
        ):
            return None
        found = deferred.plain_completion(answer.body)
        if found is None:
            return None
        content, prompt_tokens, completion_tokens = found
        try:
            candidate = tolerant_json(content)
            value = call.schema.model_validate(candidate)
        except (OutputError, ValidationError):
            return None
        if lone_surrogate(candidate, content):  # invalid: the whole way re-asks it
            return None
        return Reply(value, prompt_tokens, completion_tokens, 1, 0.0, content)

    def shape(self) -> tuple[Any, ...]:
        """What a call's first request and the reading of its reply hang on beside the
        call: the structured-output method, the reply bound's field, where the system
        message goes, and whether replies are still looked at for how it is billed."""
        return (
            self.choice.method,
            self.bound.field,
            self.system_as_user,
            self.system_check.looking,
        )

    def reads_directly(self, url: str) -> bool:
        """Whether a plain completion to this URL may be read without langchain's reader: a
        chat call, under a method that replies in text, its usage not wanted to check how the
        endpoint counts a system message."""
        return (
            deferred.is_chat(url)
            and not (self.system_check.looking and not self.system_as_user)
            and self.choice.method != StructuredMethod.function_calling
        )

    def billed(self, answer: Answer, model: str | None = None) -> None:
        """Count a batch result no row of this run reads (its row was written by a run
        stopped before it recorded the result spent; or is left out of this run, and the
        result carried): a call, and the tokens its usage says, as `_count` counts one. With
        another `model` than this one (the request was asked of it), at that model's account."""
        account = (
            self.elsewhere.setdefault(model, [0, 0, 0]) if model not in (None, self.model) else None
        )
        if account is None:
            self.pacer.traffic.calls += 1
        else:
            account[0] += 1
        body = answer.body if answer.status == 200 and isinstance(answer.body, dict) else {}
        usage = body.get("usage")
        if isinstance(usage, dict):
            for index, name in enumerate(("prompt_tokens", "completion_tokens")):
                if type(usage.get(name)) is int:
                    if account is None:
                        self.tokens[index] += usage[name]
                    else:
                        account[index + 1] += usage[name]

    def booked(self, reply: Reply[Any], fresh: bool) -> None:
        """Count a reply `read_first` read, as `structured` counts one: a call and its tokens
        when this run is the first to read it, and a valid reply under the method in use."""
        self.booked_tokens(reply.prompt_tokens, reply.completion_tokens, fresh)

    def booked_tokens(self, prompt: int, completion: int, fresh: bool) -> None:
        """`booked`, of a valid reply read by its tokens alone (the bulk lane's)."""
        if fresh:
            self.booked_replies(prompt, completion, 1, 1)
        else:
            self.booked_replies(0, 0, 0, 1)

    def booked_replies(self, prompt: int, completion: int, calls: int, replies: int) -> None:
        """`booked`, of valid replies read by their tokens alone, `calls` of them fresh, whose
        tokens these are (the bulk lane's, many at a time)."""
        self.pacer.traffic.calls += calls
        self.tokens[0] += prompt
        self.tokens[1] += completion
        self.choice.succeeded(self.choice.method, replies)

    def limit(self, schema: type[BaseModel]) -> int:
        """The bound on a reply of `schema`: what its fields need, within the stage's bound."""
        return min(self.max_tokens, schema_tokens(schema)) if self.sized else self.max_tokens

    def _sizes(self, messages: list[BaseMessage]) -> tuple[int, int]:
        """Estimated prompt tokens sent, and without the system text (0: nothing to check)."""
        if self.system_as_user:
            return estimate_tokens(messages), 0
        rest = [message for message in messages if not isinstance(message, SystemMessage)]
        return estimate_tokens(messages), estimate_tokens(rest)

    async def text(self, messages: list[BaseMessage]) -> Reply[str]:
        """Ask for plain text; a reply cut off at max_tokens is re-asked, shorter."""
        conversation = list(messages)

        async def once() -> tuple[str, AIMessage]:
            raw = await self._send(self.chat, self._shape(conversation), "text", self.max_tokens)
            assert isinstance(raw, AIMessage)
            if raw.response_metadata.get("finish_reason") == "length":
                exc = cut_off(raw, self.max_tokens)
                if isinstance(exc, OutputError):
                    conversation[:] = reask(messages, exc)
                raise exc
            return content_of(raw), raw

        return await self._retrying(once, partial(self._sizes, messages))

    def _shape(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        return system_as_user(messages) if self.system_as_user else messages

    async def _send(
        self, runnable: Runnable[Any, Any], messages: list[BaseMessage], shape: Any, limit: int
    ) -> Any:
        """One HTTP call: to the endpoint, timed to what a reply of `limit` tokens takes there,
        or on the batch road, to the row's batch result."""
        row = deferred.current()
        if row is None:
            return await runnable.ainvoke(messages, timeout=self.clock.timeout(limit))
        url, body = await self.requests.build((shape, self.bound.field), runnable, messages)
        answer = row.answer(url, body)  # or Deferred: the request goes out in a batch
        return await deferred.reply_of(self.chat, runnable, messages, url, answer)

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
        extra = self.bound.body(self.limit(schema))  # a bound extra_body replaces the model's
        if method == StructuredMethod.prompt:
            return self.chat.bind(extra_body=extra)
        if method == StructuredMethod.function_calling:
            return self.chat.bind_tools([schema], tool_choice=schema.__name__, extra_body=extra)
        if method == StructuredMethod.json_mode:
            return self.chat.bind(extra_body={**extra, "response_format": {"type": "json_object"}})
        spec = {"name": schema.__name__, "schema": schema.model_json_schema()}
        format_ = {"type": "json_schema", "json_schema": spec}
        return self.chat.bind(extra_body={**extra, "response_format": format_})

    async def _retrying(
        self,
        once: Callable[[], Awaitable[tuple[T, AIMessage]]],
        measure: Callable[[], tuple[int, int]],
    ) -> Reply[T]:
        row = _Row(time.monotonic(), measure=measure)
        await self.model_check.once(self.chat.root_async_client)
        batch = deferred.current()  # a batch line: no pacing, no waiting, no window to adapt
        while True:
            number = await self.pacer.acquire(row.sizes()[0]) if batch is None else 0
            row.calls += 1
            sent = time.monotonic()
            limited, delay, said = False, 0.0, 0.0
            try:
                value, raw = await once()
            except MethodRefused as exc:
                self._count(getattr(exc.__cause__, "raw_message", None), row)
                row.reason = self.redact(describe(exc.__cause__ or exc))
                row.calls -= 1  # the refused method's fault, not the row's: the retry is free
                continue
            except Exception as exc:
                if self._bound_refused(exc):
                    row.reason, row.calls = self.redact(describe(exc)), row.calls - 1  # free
                    continue
                limited = rate_limited(exc)
                said = (retry_after(exc) or 0.0) if limited else 0.0  # the server's, not ours
                delay = self._after_failure(exc, row, limited)
            else:
                if batch is None:  # a batch line's time is the batch's, not the server's
                    self.reachability.reached()
                    usage = raw.usage_metadata
                    written = int(usage["output_tokens"]) if usage else 0
                    self.clock.succeeded(written, time.monotonic() - sent)
                self._count(raw, row)
                # a batch line's time is the batch's: its row says 0, as read_first does
                latency = time.monotonic() - row.started if batch is None else 0.0
                tokens = row.tokens
                return Reply(value, tokens[0], tokens[1], row.calls, latency, content_of(raw))
            finally:
                if batch is None:
                    self.pacer.release(number, limited=limited, wait=delay, said=said)
            if batch is None:  # a batch line's retry goes out in a later batch: no wait here
                self.pacer.traffic.wait(delay)
                await asyncio.sleep(delay)

    def _after_failure(self, exc: Exception, row: _Row, limited: bool) -> float:
        """Book one failed attempt; the wait before the next, or raise when the row is done."""
        local = local_failure(exc)
        if local is not None:
            raise LocalClientError(self.redact(local))  # every call would fail alike
        ran = not isinstance(exc, deferred.Unanswered)  # a batch line never run: no call made
        self._count(getattr(exc, "raw_message", None), row, ran)
        row.raw = getattr(exc, "raw", None) or row.raw
        if deferred.current() is None:  # a batch result came from a reachable endpoint
            self.reachability.failed(exc)
            if isinstance(exc, openai.APITimeoutError):
                self.clock.timed_out()  # the server is slower than allowed for: allow more
        batch = deferred.current()
        first_read = batch is None or batch.fresh  # a batch result read again is counted once
        if limited:
            if batch is not None and first_read:  # the sync road counts its 429s as it paces
                self.pacer.traffic.rate_limited += 1
            delay = retry_after(exc)
            if delay is None:
                backoff = self.backoff * 2**row.limited * random.uniform(0.5, 1.0)
                delay = min(backoff, MAX_RATE_LIMIT_BACKOFF)
            row.limited += 1
            if row.waited + delay > self.rate_limit_wait:
                raise row.error(
                    f"{self.redact(describe(exc))} (still rate limited after waiting "
                    f"{row.waited:.0f}s in all; RAGEXAM_RATE_LIMIT_WAIT sets how long)"
                )
            row.waited += delay
            return delay
        row.failures += 1
        row.reason, delay = self._failure(exc, row.failures, row.tokens, row.raw)
        if row.failures > self.max_retries:
            raise row.error(f"{row.reason} (after {row.calls} attempts)")
        self.pacer.traffic.retries += first_read
        return delay

    def _bound_refused(self, exc: Exception) -> bool:
        """Whether a 400 refused the reply bound's field; the first one switches it."""
        field = self.bound.field
        if not self.bound.refused(exc):
            return False
        if self.bound.field != field:
            self.chat.extra_body = self.bound.body()
            self._runnables.clear()  # they carry the old field
        return True

    def _count(self, raw: AIMessage | None, row: _Row, ran: bool = True) -> None:
        """Add one attempt's usage to the row's tokens and to this model's totals.

        On the batch road, a result read again (a row replayed to its next call) was billed
        when this run, or an earlier one, first read it: the row counts it, the totals not.
        A batch line that never `ran` (expired, cancelled) is no call.
        """
        batch = deferred.current()
        billed = batch is None or batch.fresh
        if batch is not None and batch.fresh and ran:
            self.pacer.traffic.calls += 1  # a batch line answered: one call made
        usage = raw.usage_metadata if raw is not None else None
        if usage and self.system_check.looking and (sizes := row.sizes())[1]:
            self.system_check.observe(sizes[0], sizes[1], usage["input_tokens"])
        if usage:
            for index, used in enumerate((usage["input_tokens"], usage["output_tokens"])):
                row.tokens[index] += used
                self.tokens[index] += used if billed else 0

    def _failure(
        self, exc: Exception, attempt: int, tokens: list[int], raw: str | None = None
    ) -> tuple[str, float]:
        """What one failed attempt means: its reason and the wait before the next, or raise
        (with `raw`, the last reply that was not valid, kept on the error row)."""
        reason = self.redact(describe(exc))
        if isinstance(exc, openai.AuthenticationError):
            raise AuthError(
                f"the endpoint refused the API key: {reason}; check OPENAI_API_KEY (and "
                "OPENAI_BASE_URL: the key must be one this endpoint issued)"
            ) from None
        if isinstance(exc, openai.PermissionDeniedError):  # the key works: not for this call
            raise AuthError(
                f"the endpoint refused the call: {reason} (the key's access to the model, or "
                "this request)"
            ) from None
        spent = (tokens[0], tokens[1])
        if isinstance(exc, NoAnswer):  # asking again would pay for the same refusal
            raise LLMError(reason, attempts=attempt, raw=raw, tokens=spent) from None
        if isinstance(exc, openai.RateLimitError):  # a 429 that means "no": out of quota
            raise AuthError(f"the endpoint refused the call: {reason}; check the account's quota")
        if not isinstance(exc, RETRYABLE):
            if isinstance(exc, openai.APIError | LLMError):  # ContextFull: asked again, cut again
                raise LLMError(reason, attempts=attempt, raw=raw, tokens=spent) from None
            raise exc  # not an API failure: a bug, keep its traceback
        waited = retry_after(exc)
        if waited is not None:
            return reason, waited
        return reason, self.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.0)
