"""A row's chat calls on the batch road: answered from batch results, or deferred as requests.

The batch road runs a stage's own work for a row, through the same LLM calls as the sync road,
with a `RowCalls` in context. Each call's request body is the one the langchain-openai and
openai SDK stack sends (requests.py builds it from that stack). When a result for that call and
body has come back, the call returns it, read as the sync path reads a reply, and the row goes
on (validation, re-asks and retries are the client's, unchanged). When none has, the call
raises `Deferred` with its request: the row stops there, and the request goes out in a shard.

A result is only ever used for the body it was asked with (its digest): a row whose input
changed since is asked again, never answered with an old result. Two calls of a row with the
same body (a retry, a second sample) take that body's results in the order they were asked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx2
import openai
from langchain_core.messages import AIMessage, BaseMessage

from ragexam.io.batchfiles import UNRUN, Answer
from ragexam.llm.replies import CHAT_PATH, InvalidReply, NoAnswer, choice_of, missing_answer

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable
    from langchain_openai import ChatOpenAI

Route = Callable[[httpx2.Request], Awaitable[httpx2.Response]]
_ROUTE: ContextVar[Route | None] = ContextVar("ragexam_route", default=None)
_ROW: ContextVar[RowCalls | None] = ContextVar("ragexam_row_calls", default=None)


class Deferred(BaseException):
    """A call whose result has not come back: the row stops here; its request goes out.

    A BaseException, as asyncio's CancelledError is: it must pass the retry layer and every
    `except Exception` on its way up, untouched, to the batch road that asked.
    """

    def __init__(self, call: int, digest: str, url: str, body: bytes) -> None:
        super().__init__(f"call {call} of the row waits for its batch result")
        self.call, self.digest, self.url, self.body = call, digest, url, body


class Unanswered(openai.OpenAIError):
    """A request the batch never ran (it expired, was cancelled, or failed): retried."""


def digest_of(body: bytes) -> str:
    """The digest of a request body that its custom_id carries."""
    return digest_state(body).hexdigest()


def digest_state(start: bytes) -> hashlib.blake2b:
    """The digest's state after the start of a body: the rest is added by `update`."""
    return hashlib.blake2b(start, digest_size=8)


@dataclass(frozen=True)
class Known:
    """A result for one of a row's calls, and whether this run is the first to read it."""

    answer: Answer
    call: int  # the call it answered, in the row's order
    fresh: bool  # from a result file this run merges; else carried over, already counted
    line: bytes = b""  # the result line as it came, to carry it to a later pass


@dataclass
class RowCalls:
    """One row's calls on the batch road, and the results known for them, by body digest.

    A call takes the next result asked with its very body: the row's first call with a body
    takes its first result, a retry of that body the second. (Results are matched by body
    rather than by position: a row replayed after another row switched the structured-output
    method skips the calls that method change made needless, as the sync road never makes
    them.) A call whose body has no result left raises Deferred, numbered after every call
    the row has had a result for, so that each request of a row has its own custom_id.
    """

    key: str
    known: Mapping[str, list[Known]] = field(default_factory=dict)
    used: list[Known] = field(default_factory=list)  # the results the row went through
    fresh: bool = False  # the last result is new to this run: its tokens are billed

    def __post_init__(self) -> None:
        calls = [item.call for results in self.known.values() for item in results]
        self.next_call = max(calls) + 1 if calls else 0
        self._taken: dict[str, int] = {}

    def answer(self, url: str, body: bytes) -> Answer:
        """The result of the row's next call with this body, or Deferred."""
        digest = digest_of(body)
        taken = self._taken.get(digest, 0)
        results = self.known.get(digest, ())
        if taken >= len(results):
            raise Deferred(self.next_call, digest, url, body)
        found = results[taken]
        self._taken[digest] = taken + 1
        self.used.append(found)
        self.fresh = found.fresh
        return found.answer


def current() -> RowCalls | None:
    """The RowCalls of the row being done on the batch road, if any."""
    return _ROW.get()


@contextmanager
def calls_of(row: RowCalls) -> Iterator[RowCalls]:
    """Do the row's calls through `row` within this block."""
    token = _ROW.set(row)
    try:
        yield row
    finally:
        _ROW.reset(token)


@contextmanager
def routed(route: Route) -> Iterator[None]:
    """Within this block, the HTTP requests of LLM clients go to `route`, not the network."""
    token = _ROUTE.set(route)
    try:
        yield
    finally:
        _ROUTE.reset(token)


class RoutableTransport(httpx2.AsyncBaseTransport):
    """The HTTP transport, unless a route is set in context: then the route answers."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """Send the request, or hand it to the route in context."""
        route = _ROUTE.get()
        if route is not None:
            return await route(request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self.inner.aclose()


async def reply_of(
    chat: ChatOpenAI,
    runnable: Runnable[Any, Any],
    messages: list[BaseMessage],
    url: str,
    answer: Answer,
) -> Any:
    """A result, read as the sync path reads the same reply from the endpoint.

    A completion is read by langchain-openai's own reader of completions, after the checks the
    HTTP hook makes (replies.py); anything else (an HTTP error) goes through the whole stack,
    so the SDK raises the very error the sync path would meet.
    """
    if answer.status == UNRUN:
        raise Unanswered(answer.reason or "the batch gave no result for this request")
    if answer.status == 200 and isinstance(answer.body, dict) and is_chat(url):
        return completion_message(chat, answer.body)

    async def respond(request: httpx2.Request) -> httpx2.Response:
        body = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
        headers = {"content-type": "application/json"}
        return httpx2.Response(answer.status, headers=headers, content=body, request=request)

    with routed(respond):
        return await runnable.ainvoke(messages)


def completion_message(chat: ChatOpenAI, body: dict[str, Any]) -> AIMessage:
    """A chat completion as the AIMessage langchain-openai makes of it (fast: no HTTP stack)."""
    no_answer = missing_answer(choice_of(body))
    if no_answer:
        raise NoAnswer(no_answer)
    result = chat._create_chat_result(body)
    generation = result.generations[0]
    message = generation.message
    # As langchain-core's invoke does: the generation's info joins the message's metadata.
    message.response_metadata = {**(generation.generation_info or {}), **message.response_metadata}
    assert isinstance(message, AIMessage)
    return message


def plain_completion(body: dict[str, Any]) -> tuple[str, int, int] | None:
    """(text, prompt tokens, completion tokens) of a completion that holds one assistant text
    and its usage and nothing else to read (no tool call, not cut off, not refused), in the
    shape langchain-openai reads without fail; else None: the whole way reads it, and meets
    whatever it meets."""
    choices, usage = body.get("choices"), body.get("usage")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(usage, dict):
        return None
    try:
        choice = choice_of(body)
    except InvalidReply:
        return None
    message = choice["message"]  # of the assistant, its usage counts: choice_of checked
    content = message.get("content")
    if (
        not isinstance(content, str)
        or message.get("tool_calls")
        or message.get("function_call")
        or choice.get("finish_reason") in ("length", "content_filter")
    ):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int:
        return None
    return content, prompt, completion


def is_chat(url: str) -> bool:
    """Whether a request goes to chat completions (whose replies are read fast)."""
    return url.endswith(CHAT_PATH)
