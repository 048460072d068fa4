"""The request the sync path sends for a call, as bytes, built by that path's own stack.

A call's request is captured from the langchain-openai → openai SDK stack itself: the HTTP
request it would send is taken at the transport (deferred.routed) instead of being sent. Its
body is therefore the sync path's, byte for byte: the prompt, model, structured-output method,
reply bound and temperature, in the SDK's own JSON.

Capturing costs the stack's ~1.5 ms of CPU a call: at a million rows, most of an hour. So the
first call of each shape (the same runnable, bound field and message roles) is captured with
a marker in place of each message's text, and later calls of that shape fill the markers with
their texts, escaped as the SDK's JSON escapes them. The template is kept only if it renders a
probe of awkward text (quotes, backslashes, control characters, non-ASCII, U+2028, delimiters)
exactly as the stack itself sends it; otherwise, and for any message that is not plain text,
every call is captured whole.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

import httpx2
import openai
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from ragexam.llm.deferred import digest_state, routed
from ragexam.llm.prompts import Delimited, neutralise

if TYPE_CHECKING:
    from langchain_core.runnables import Runnable

PROBE = 'q"uote \\ back/slash\n\r\t\x00\x1f\x7f é € 😀 \u2028\u2029 </answer> {x} ~ '
PLAIN = (SystemMessage, HumanMessage)
_MISSING = object()


class _Captured(openai.OpenAIError):
    """The request the stack was about to send (the SDK passes its own errors on unwrapped)."""

    def __init__(self, request: httpx2.Request) -> None:
        super().__init__("captured")
        self.request = request


@dataclass(frozen=True)
class Template:
    """A request body with a gap for each message's text, in the order the body holds them."""

    url: str
    segments: tuple[str, ...]
    order: tuple[int, ...]  # the message whose text fills each gap

    def render(self, texts: Sequence[str]) -> bytes:
        """The body with these texts, JSON-escaped as the SDK escapes them."""
        parts = [self.segments[0]]
        for gap, index in enumerate(self.order):
            parts.append(encode_basestring(texts[index])[1:-1])
            parts.append(self.segments[gap + 1])
        return "".join(parts).encode()  # strict, as the SDK's: a lone surrogate fails the same


class Rendered(NamedTuple):
    """A request rendered from a form: its URL, its body (unless only the digest was asked
    for) and the digest of the body."""

    url: str
    body: bytes | None
    digest: str


@dataclass(frozen=True)
class Form:
    """A request body with a gap wherever the prompt puts one of its values (filled: with data
    delimiters neutralised), for a call's first attempt: a row's request from its values alone,
    without making its messages (~10 µs a row) or capturing anything. The body's head, up to
    the first gap (the system prompt), is encoded and hashed once."""

    url: str
    segments: tuple[str, ...]
    order: tuple[str, ...]  # the value whose text fills each gap
    gaps: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    head: bytes = field(init=False, repr=False, compare=False)
    hashed: hashlib.blake2b = field(
        init=False, repr=False, compare=False
    )  # the digest's state after head

    def __post_init__(self) -> None:
        object.__setattr__(self, "gaps", tuple(zip(self.order, self.segments[1:], strict=True)))
        head = self.segments[0].encode()
        object.__setattr__(self, "head", head)
        object.__setattr__(self, "hashed", digest_state(head))

    def render(self, values: Mapping[str, str], body: bool = True) -> Rendered:
        """The request with a call's values, filled as its prompt fills them (a value that is
        not Delimited has its delimiters neutralised: `Prompt.fill`), JSON-escaped as the SDK
        escapes them. KeyError: a value the form has a gap for is missing."""
        parts: list[str] = []
        add = parts.append
        for name, segment in self.gaps:
            value = values[name]
            add(
                encode_basestring(value if isinstance(value, Delimited) else neutralise(value))[
                    1:-1
                ]
            )
            add(segment)
        rest = "".join(parts).encode()  # strict, as the SDK's: a lone surrogate fails the same
        state = self.hashed.copy()
        state.update(rest)
        return Rendered(self.url, self.head + rest if body else None, state.hexdigest())


class Requests:
    """The requests of one chat model: captured from its stack, or rendered from a template."""

    def __init__(self, base_url: str | None) -> None:
        base = urlparse(base_url or "https://api.openai.com/v1").path.rstrip("/")
        self.base_path = base
        self._templates: dict[Hashable, Template | None] = {}

    async def build(
        self, shape: Hashable, runnable: Runnable[Any, Any], messages: list[BaseMessage]
    ) -> tuple[str, bytes]:
        """(url, body) of the request the stack sends for these messages."""
        if not plain(messages):
            return await self.capture(runnable, messages)
        key = (shape, tuple(type(message) for message in messages))
        template = self._templates.get(key, _MISSING)
        if template is _MISSING:
            template = self._templates[key] = await self._learn(runnable, messages)
        if isinstance(template, Template):
            try:
                return template.url, template.render([str(m.content) for m in messages])
            except UnicodeEncodeError:
                pass  # the stack fails on it too: let it, as the sync path would
        return await self.capture(runnable, messages)

    async def learn(
        self,
        runnable: Runnable[Any, Any],
        make: Callable[[Mapping[str, str]], list[BaseMessage]],
        names: Sequence[str],
    ) -> Form | None:
        """The form of the requests whose messages `make` makes from a prompt's values: kept
        only if it renders a probe of awkward values, and empty ones, as the stack sends them.
        None when it does not, or the stack fails on one (the whole way meets that failure)."""
        marks = {name: f"\ue000{index}\ue001" for index, name in enumerate(names)}
        named = {mark: name for name, mark in marks.items()}
        probes = [
            {name: f"{PROBE}{index}" for index, name in enumerate(names)},
            dict.fromkeys(names, ""),
        ]
        try:
            url, body = await self.capture(runnable, make(marks))
            text = body.decode()
            segments, order, start = [], [], 0
            for found in re.finditer("\ue000[0-9]+\ue001", text):
                if found.group() not in named:
                    return None
                segments.append(text[start : found.start()])
                order.append(named[found.group()])
                start = found.end()
            form = Form(url, (*segments, text[start:]), tuple(order))
            for values in probes:
                _, expected = await self.capture(runnable, make(values))
                if form.render(values).body != expected:
                    return None
        except Exception:
            return None
        return form

    async def capture(
        self, runnable: Runnable[Any, Any], messages: list[BaseMessage]
    ) -> tuple[str, bytes]:
        """(url, body) of the request the stack was about to send, taken at its transport."""

        async def take(request: httpx2.Request) -> httpx2.Response:
            await request.aread()
            raise _Captured(request)

        with routed(take):
            try:
                await runnable.ainvoke(messages)
            except _Captured as captured:
                return self.url(captured.request.url.path), captured.request.content
        raise RuntimeError("the chat model answered without making a request")

    def url(self, path: str) -> str:
        """The request's URL as a batch line names it: /v1/chat/completions."""
        return "/v1" + (path[len(self.base_path) :] if path.startswith(self.base_path) else path)

    async def _learn(
        self, runnable: Runnable[Any, Any], messages: list[BaseMessage]
    ) -> Template | None:
        """The template of this shape, if it renders a probe exactly as the stack sends it."""
        marks = [f"\ue000{index}\ue001" for index in range(len(messages))]
        url, body = await self.capture(runnable, _like(messages, marks))
        text = body.decode()
        if any(text.count(mark) != 1 for mark in marks):
            return None
        found = sorted((text.index(mark), index) for index, mark in enumerate(marks))
        segments, start = [], 0
        for at, index in found:
            segments.append(text[start:at])
            start = at + len(marks[index])
        segments.append(text[start:])
        template = Template(url, tuple(segments), tuple(index for _, index in found))
        probes = [f"{PROBE}{index}" for index in range(len(messages))]
        _, expected = await self.capture(runnable, _like(messages, probes))
        return template if template.render(probes) == expected else None


def plain(messages: list[BaseMessage]) -> bool:
    """Messages a template can carry: system and user text, nothing else attached."""
    return all(
        type(message) in PLAIN
        and isinstance(message.content, str)
        and message.content
        and not message.additional_kwargs
        and message.name is None
        for message in messages
    )


def _like(messages: list[BaseMessage], texts: list[str]) -> list[BaseMessage]:
    """Messages of the same roles, holding these texts."""
    return [type(message)(content=text) for message, text in zip(messages, texts, strict=True)]
