"""What ragexam learns about an endpoint: whether it lists the model, which field bounds a reply.

llama.cpp's server, and some proxies, answer every model name with the one model they have,
so a misspelt RAGEXAM_MODEL would go unnoticed. Where `GET /v1/models` answers, the model is
looked up there once, before a stage's first call, and once per command for a model and base
URL (`ragexam run` does not look it up again in each stage: its session's memory says so).
The warning goes to the `ragexam` logger; the CLI shows it as one line.

Every reply is bounded. OpenAI wants `max_completion_tokens` (its reasoning models refuse
`max_tokens`, and it refuses both together); llama-cpp-python reads only `max_tokens`. Each
gets its own, and a refusal naming the field switches to the other, once.

An endpoint that cannot be reached is described by the innermost cause ("Connection
refused"), not the SDK's "Connection error.".
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:  # the SDK loads with the first stage, not with the CLI's run scope
    import openai

from ragexam.errors import EndpointError, UnknownModel
from ragexam.io.manifest import read_manifest
from ragexam.urls import mask_url

logger = logging.getLogger("ragexam")
BOUND_FIELDS = ("max_tokens", "max_completion_tokens")
REFUSAL_WORDS = ("unsupported", "not supported", "unrecognized", "unknown", "not permitted")
LIST_TIMEOUT = 10.0
SHOWN = 5
UNREACHABLE_TO_STOP = 20  # the first calls of a stage, all failing to reach the endpoint


async def listed_models(client: openai.AsyncOpenAI) -> list[str] | None:
    """The ids `GET /v1/models` lists, or None when the endpoint does not answer it."""
    import openai

    try:
        page = await client.models.list(timeout=LIST_TIMEOUT)
    except (openai.OpenAIError, ValueError, TypeError):
        return None  # no listing (404, an old server, a proxy): nothing to check against
    ids = [str(getattr(model, "id", "")) for model in page.data]
    return [model_id for model_id in ids if model_id] or None


def endpoint_key(model: str, base_url: str | None) -> str:
    """How a model at an endpoint is named in the manifest (credentials masked)."""
    return f"{model} at {mask_url(base_url or 'https://api.openai.com/v1')}"


def absent_model_warning(model: str, listed: list[str] | None) -> str | None:
    """One line when `model` is not among the listed ones; None when it is, or nothing is listed."""
    if listed is None or model in listed:
        return None
    names = ", ".join(listed[:SHOWN]) + (
        f" and {len(listed) - SHOWN} more" if len(listed) > SHOWN else ""
    )
    return (
        f"model {model!r} is not among the models the endpoint lists ({names}); a server that "
        "answers any name (llama.cpp) is then using its own model: check RAGEXAM_MODEL or --model"
    )


class EndpointMemory:
    """What one command learned of its endpoints: the models already looked up there, and
    each endpoint's rate limit, learned once and paced from by every later stage.

    The rates are kept in the run folder's manifest (`endpoints`), so the next command on
    the same folder starts from them too, instead of meeting the limit again at full speed.
    """

    def __init__(self) -> None:
        self.checked: set[tuple[str | None, str]] = set()
        self.rates: dict[str, tuple[float, float]] = {}  # calls a second, and over what span
        self.sends: dict[str, deque[float]] = {}  # recent send times, by model and URL
        self.speeds: dict[str, float] = {}  # reply tokens a second, by model and URL
        self.recalled: set[Path] = set()

    def rate(self, key: str) -> tuple[float, float] | None:
        """The rate (calls a second) and window (seconds) learned for this model and URL."""
        return self.rates.get(key)

    def sends_of(self, key: str) -> deque[float]:
        """When this command's stages sent their recent calls to this model and URL: a stage
        that meets the limit learns it from all of them (pacing.LearnedRate)."""
        return self.sends.setdefault(key, deque())

    def learned(self, key: str, rate: float, span: float) -> None:
        """Keep the rate a stage ended with, for the next stage and the next command."""
        if rate > 0 and span > 0:
            self.rates[key] = (rate, span)

    def recall(self, out: Path) -> None:
        """Take what an earlier command on this run folder learned (once per folder)."""
        if out in self.recalled:
            return
        self.recalled.add(out)
        saved = read_manifest(out).get("endpoints") or {}
        for key, entry in saved.items() if isinstance(saved, dict) else ():
            try:
                rate, span = float(entry["rpm"]) / 60, float(entry["window_s"])
            except (KeyError, TypeError, ValueError):
                continue
            if key not in self.rates:
                self.learned(key, rate, span)

    def saved(self) -> dict[str, dict[str, float]]:
        """The rates as the manifest keeps them."""
        return {
            key: {"rpm": round(rate * 60, 1), "window_s": round(span, 3)}
            for key, (rate, span) in self.rates.items()
        }

    def first_check(self, base_url: str | None, model: str) -> bool:
        """True the first time this model at this base URL is looked up."""
        key = (base_url, model)
        first = key not in self.checked
        self.checked.add(key)
        return first


class SystemCheck:
    """Warns once per endpoint when its replies' usage shows the system message was dropped.

    llama.cpp's gemma chat format drops system messages: the server then bills a fraction of
    the prompt ragexam sent (69-110 tokens of 423-476 measured), and the model never sees
    the instructions. The first calls' usage is compared with an estimate of what was sent.
    """

    CALLS = 3  # calls looked at
    SHARE = 0.5  # billed below this share of the estimate ...
    REST = 1.5  # ... and within this multiple of the estimate without the system message

    def __init__(self, base_url: str | None, memory: EndpointMemory) -> None:
        self.base_url, self.memory, self.seen = base_url, memory, 0

    @property
    def looking(self) -> bool:
        """Whether calls are still looked at (estimating a prompt's tokens costs ~5 us)."""
        return self.seen < self.CALLS

    def observe(self, sent: int, without_system: int, billed: int) -> None:
        """One call's estimated prompt tokens, with and without its system text, and its bill."""
        if self.seen >= self.CALLS or not billed or without_system >= sent:
            return
        self.seen += 1
        dropped = billed < self.SHARE * sent and billed <= self.REST * without_system
        if dropped and self.memory.first_check(self.base_url, "(system messages)"):
            logger.warning(
                f"the endpoint billed {billed} prompt tokens where about {sent} were sent: its "
                "chat template drops the system message (llama.cpp's gemma format does), so the "
                "model never sees ragexam's instructions; set RAGEXAM_SYSTEM_PROMPT=user"
            )


class ModelCheck:
    """Warns, through the `ragexam` logger, when the endpoint does not list the model."""

    def __init__(
        self, model: str, base_url: str | None = None, memory: EndpointMemory | None = None
    ) -> None:
        self.model, self.base_url, self.done = model, base_url, False
        self.memory = memory or EndpointMemory()
        self._lock = asyncio.Lock()

    async def once(self, client: openai.AsyncOpenAI) -> None:
        """Look the model up before the first call; the calls in flight wait for the one check."""
        if self.done:
            return
        async with self._lock:
            if not self.done and self.memory.first_check(self.base_url, self.model):
                warning = absent_model_warning(self.model, await listed_models(client))
                if warning is not None:
                    logger.warning(warning)
            self.done = True


class ReplyBound:
    """The bound on every reply, in the field the endpoint reads; switched once when refused."""

    def __init__(self, base_url: str | None, limit: int) -> None:
        self.limit = limit
        openai_itself = base_url is None or "api.openai.com" in base_url
        self.field = BOUND_FIELDS[1] if openai_itself else BOUND_FIELDS[0]
        self.switched = False

    def body(self, limit: int | None = None) -> dict[str, int]:
        """The request field to send: the stage's bound, or a call's own."""
        return {self.field: limit or self.limit}

    def refused(self, exc: BaseException) -> bool:
        """True when a 400 refuses a bound field: the first such refusal switches the field."""
        import openai

        if not isinstance(exc, openai.BadRequestError):
            return False
        text = f"{exc.message} {exc.body}".lower()
        named = sorted((text.find(f), f) for f in BOUND_FIELDS if f in text)
        if not named or not any(word in text for word in REFUSAL_WORDS):
            return False
        field = named[0][1]  # "'max_tokens' is not supported ... use 'max_completion_tokens'"
        if field != self.field:
            return True  # already switched by a call in flight: retry on the new field
        if self.switched:
            return False  # both fields refused: a real error
        self.field, self.switched = BOUND_FIELDS[1 - BOUND_FIELDS.index(field)], True
        return True


def root_cause(exc: BaseException) -> str:
    """The innermost cause of a connection error: "Connection refused", not "Connection error."."""
    inner: BaseException = exc
    while (nested := inner.__cause__ or inner.__context__) is not None:
        inner = nested
    if isinstance(inner, OSError) and inner.errno:
        return f"{os.strerror(inner.errno)} ({inner.strerror or inner})"
    return str(inner) or str(exc.__cause__ or exc)


LOCAL_FAILURES = (TypeError, AttributeError, ImportError, NotImplementedError, RuntimeError)
STACK = ("openai", "httpx", "httpx2", "aiohttp")


def local_failure(exc: BaseException) -> str | None:
    """What failed inside this process before a call reached the endpoint, or None.

    The SDK reports any exception its HTTP client raises as a connection error; a TypeError
    (an httpx2 client given to an SDK that speaks httpx) is a mismatch of installed packages,
    which no endpoint setting fixes.
    """
    chain: list[BaseException] = []
    inner: BaseException | None = exc
    while inner is not None and inner not in chain:
        chain.append(inner)  # what it was raised from, or during (unless `from None` hid it)
        inner = inner.__cause__ or (None if inner.__suppress_context__ else inner.__context__)
    if any(isinstance(link, OSError) for link in chain):
        return None  # refused, reset, unreachable, a timeout, TLS: the network's
    found = next((link for link in chain if isinstance(link, LOCAL_FAILURES)), None)
    if found is None or (found is exc and not _raised_in_the_stack(exc)):
        return None  # not the HTTP stack's: a bug, which keeps its traceback
    from importlib.metadata import PackageNotFoundError, version

    versions = []
    for name in STACK:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    reason = " ".join(f"{type(found).__name__}: {found}".split())[:300]
    return (
        f"the HTTP client failed inside ragexam before the call reached the endpoint ({reason}); "
        f"this is a mismatch of the installed packages ({', '.join(versions)}), not the "
        "endpoint: install ragexam into a fresh environment, or report it with these versions"
    )


def _raised_in_the_stack(exc: BaseException) -> bool:
    """Whether the exception passed through the SDK's or an HTTP library's code."""
    frame = exc.__traceback__
    while frame is not None:
        module = str(frame.tb_frame.f_globals.get("__name__", ""))
        if module.split(".")[0] in STACK:
            return True
        frame = frame.tb_next
    return False


def no_such_model(exc: Exception, model: str) -> bool:
    """Whether a 404 says the model asked for is unknown, not the URL: OpenAI's
    `model_not_found`, or the words vLLM ("The model `x` does not exist") and Ollama
    ("model \"x\" not found") use, naming that very model (a wrong URL's page may say
    "model" and "not found" too, but not the model's name)."""
    if getattr(exc, "code", None) == "model_not_found":
        return True
    said = str(exc).lower()
    named = model.lower() in said and "model" in said
    return named and ("does not exist" in said or "not found" in said)


class Reachability:
    """Stops a stage whose first calls all fail to reach the endpoint (or hit a wrong URL)."""

    def __init__(self, base_url: str | None, redact: Callable[[str], str], model: str = "") -> None:
        self.endpoint = redact(base_url or "https://api.openai.com/v1")
        self.model = model
        self.redact = redact
        self.missed = 0  # calls that failed to reach it before any reached it
        self.ok = False
        self.cause = ""  # why the last of them failed
        self.answered = False  # with a 404: the server is up, the URL's path is not its
        self.page = False  # with a 2xx that is not JSON: something answers, not the API

    def reached(self) -> None:
        """A call got an answer from the endpoint."""
        self.ok = True

    def failed(self, exc: Exception) -> None:
        """Book a failed call; raise EndpointError at the UNREACHABLE_TO_STOP-th miss."""
        import openai  # loaded by then: the call that failed went through it

        if isinstance(exc, openai.NotFoundError) and no_such_model(exc, self.model):
            said = self.redact(" ".join(str(exc).split())[:300])
            raise UnknownModel(  # the endpoint is the right one: the model is not among its own
                f"the endpoint {self.endpoint} serves no model {self.model!r}: it answered "
                f"HTTP 404 ({said}); name one it serves with --model (or RAGEXAM_MODEL)"
            )
        from ragexam.llm.replies import NotAnApi

        timeout = isinstance(exc, openai.APITimeoutError)
        missed = isinstance(exc, openai.APIConnectionError | openai.NotFoundError) and not timeout
        missed = missed or isinstance(exc, NotAnApi)  # a page, not the API, answers there
        if isinstance(exc, openai.APIStatusError) and not missed:
            self.ok = True
        if self.ok or not missed:
            return
        self.missed += 1
        cause = root_cause(exc) if isinstance(exc, openai.APIConnectionError) else exc
        self.cause = self.redact(str(cause))
        self.answered = isinstance(exc, openai.NotFoundError)
        self.page = isinstance(exc, NotAnApi)
        if self.missed >= UNREACHABLE_TO_STOP:
            raise EndpointError(
                f"the endpoint {self.endpoint} failed the first {self.missed} calls: {self.why()}"
            )

    def why(self) -> str:
        """Why the calls failed, and what to check: a server that answers 404 is up, at
        another path; one that speaks no TLS is up, on http; one that answers pages is no API."""
        if self.page:
            return (
                f"{self.cause}: no OpenAI-compatible API answers at that URL (a login page, a "
                "gateway, a web server?); check OPENAI_BASE_URL"
            )
        if self.answered:
            path = urlparse(self.endpoint).path.rstrip("/")
            under = (
                ""
                if path.endswith("/v1")
                else f"; OpenAI-compatible servers answer under /v1: OPENAI_BASE_URL="
                f"{self.endpoint.rstrip('/')}/v1?"
            )
            return f"it answered HTTP 404 ({self.cause}): no chat completions at that URL{under}"
        if "WRONG_VERSION_NUMBER" in self.cause:  # the errno beside it says nothing true
            tls = self.cause[max(self.cause.find("[SSL"), 0) :].rstrip(")")
            return (
                f"cannot connect over TLS ({tls}): it speaks no TLS there: use http://, not "
                "https://, in OPENAI_BASE_URL"
            )
        return f"cannot connect: {self.cause}; check OPENAI_BASE_URL and that it is up"

    def never_reached(self) -> EndpointError | None:
        """After a stage: the error to stop with when it made calls and none reached the
        endpoint (a stage of fewer calls than UNREACHABLE_TO_STOP), else None."""
        if self.ok or not self.missed:
            return None
        return EndpointError(
            f"the endpoint {self.endpoint} failed every call of the stage ({self.missed}): "
            f"{self.why()}"
        )
