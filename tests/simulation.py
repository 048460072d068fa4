"""Pacing on virtual time: ragexam's own LLM, pacer and retry loop against a simulated server.

A `VirtualLoop` is an asyncio event loop whose clock jumps to the next timer instead of
waiting for it, so a minute of a rate limit passes in milliseconds of real time and nothing
else on the machine can disturb the figures. The chat model is the only stand-in: `Server`
answers each call after its latency, or refuses it with a real openai.RateLimitError and a
Retry-After, from the same limiters the HTTP test server uses (limits.py). Everything above it
(LLM.text, the retry layer, the window, the learned rate, --rpm and --tpm) is the code users run.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from limits import Bucket, SlidingWindow

from ragexam.config import load_settings
from ragexam.llm.client import LLM
from ragexam.llm.endpoint import EndpointMemory
from ragexam.llm.pacing import estimate_tokens

TICK = 1e-6  # the virtual clock's smallest step


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """Never waits: a timeout moves the loop's clock forward instead."""

    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None:
            # At least a microsecond: a timer a float's rounding error away would otherwise
            # fire again and again without the clock moving (aiolimiter sets such timers).
            self.loop.now += max(timeout, TICK)
        return ready  # type: ignore[no-any-return]


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: timers fire at once, in order, with the clock moved on."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        """The virtual clock."""
        return self.now


@dataclass
class Call:
    """One call the server received: when, and whether the limit refused it."""

    at: float
    refused: bool
    tokens: int


@dataclass
class Server:
    """A chat model behind a rate limit: `latency` seconds a call, refused when the limit says."""

    limit: SlidingWindow | Bucket
    latency: float = 1.0
    by_tokens: bool = False  # the limit counts prompt tokens, not calls
    calls: list[Call] = field(default_factory=list)
    jitter: float = 0.1  # each call takes latency * (1 +- jitter), seeded: real servers vary
    root_async_client: Any = None  # what the model check would list models with: unused

    def __post_init__(self) -> None:
        self._random = random.Random(0)

    async def ainvoke(self, messages: list[BaseMessage], **_: Any) -> AIMessage:
        """Answer after the latency, or raise a 429 saying when the limit frees."""
        loop = asyncio.get_running_loop()
        tokens = estimate_tokens(messages)
        wait = self.limit.admit(loop.time(), tokens if self.by_tokens else 1)
        self.calls.append(Call(loop.time(), wait is not None, tokens))
        if wait is not None:
            raise _too_many(wait)
        await asyncio.sleep(self.latency * self._random.uniform(1 - self.jitter, 1 + self.jitter))
        usage = {"input_tokens": tokens, "output_tokens": 5, "total_tokens": tokens + 5}
        return AIMessage("ok", usage_metadata=usage, response_metadata={"finish_reason": "stop"})


def _too_many(wait: float) -> openai.RateLimitError:
    """The 429 the SDK raises for a refusal with this Retry-After (in milliseconds)."""
    request = httpx2.Request("POST", "http://simulated/v1/chat/completions")
    headers = {"retry-after-ms": str(round(wait * 1000))}
    response = httpx2.Response(429, headers=headers, request=request)
    return openai.RateLimitError("Rate limit reached (simulated).", response=response, body=None)


@dataclass(frozen=True)
class Run:
    """What a simulated stage did: rows done, calls, 429s, its span, and the rate it learned."""

    rows_ok: int
    calls: list[Call]
    seconds: float
    learned_rpm: int | None

    @property
    def limited(self) -> float:
        """The share of calls the limit refused."""
        return sum(call.refused for call in self.calls) / len(self.calls)

    def limited_after(self, seconds: float) -> float:
        """The share refused among the calls made `seconds` or later after the first."""
        later = [call for call in self.calls if call.at > self.calls[0].at + seconds]
        return sum(call.refused for call in later) / len(later)


def simulate(server: Server, rows: int, prompt: str = "question", **flags: Any) -> Run:
    """`rows` calls through one LLM, `concurrency` at a time (flags as `load_settings` takes
    them: concurrency, rpm, tpm...), each row on its own as the runner runs them."""
    return simulate_stages(server, [rows], prompt, **flags)[0]


def simulate_stages(
    server: Server,
    stages: list[int],
    prompt: str = "question",
    memory: EndpointMemory | None = None,
    **flags: Any,
) -> list[Run]:
    """Stages of one command, one after another at once, each of so many rows through an LLM
    of its own that shares what the command learned of the endpoint (as `run`'s stages do;
    `memory`: what it knew before, an earlier command's rate)."""
    settings = load_settings(None, openai_base_url="http://simulated/v1", **flags)
    memory = memory or EndpointMemory()
    loop = VirtualLoop()
    try:
        return [
            loop.run_until_complete(_stage(settings, server, rows, prompt, memory))
            for rows in stages
        ]
    finally:
        loop.close()


async def _stage(
    settings: Any, server: Server, rows: int, prompt: str, memory: EndpointMemory
) -> Run:
    llm = LLM(settings, "simulated-model", memory=memory)
    llm.chat = server  # type: ignore[assignment]  # the one stand-in: the model behind HTTP
    llm.model_check.done = True  # no model list to look the model up in
    queue = list(range(rows))
    done = 0

    async def worker() -> None:
        nonlocal done
        while queue:
            number = queue.pop()
            await llm.text([HumanMessage(f"{prompt} {number}")])
            done += 1

    started = asyncio.get_running_loop().time()
    await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    seconds = asyncio.get_running_loop().time() - started
    learned = llm.pacer.learned  # kept for the next stage, as LLM.aclose keeps it
    memory.learned(llm.key, learned.rate, learned.span)
    calls = [call for call in server.calls if call.at >= started]
    return Run(done, calls, seconds, llm.pacer.traffic.learned_rpm)
