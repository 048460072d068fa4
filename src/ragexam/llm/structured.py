"""Structured output: read a model's reply as a validated pydantic object, or say why not.

Replies are parsed tolerantly (a tool call, or the first JSON object in the text, code fences
and prose around it allowed, raw newlines inside strings too), then validated. An invalid reply
is re-asked with the original conversation and one short note saying why (instructor-style,
without growing the prompt); a server that cannot take the schema gets it in the prompt instead.
Which method a stage uses is settled by its first call, and switched once per refusal.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from typing import Any, TypeVar

import openai
import orjson
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ValidationError

from ragexam.config import StructuredMethod
from ragexam.errors import ContextFull, LLMError, OutputError

M = TypeVar("M", bound=BaseModel)
CUT_OFF = "the reply was cut off at max_tokens (finish_reason=length)"
CONTEXT_FULL = 0.9  # a reply cut below this share of its bound was cut by the context window
_TOLERANT = json.JSONDecoder(strict=False)  # small models write raw newlines inside strings
STRING_TOKENS = 160  # a free-text field's allowance, where the schema sets no maxLength
ARRAY_ITEMS = 8  # an array's items, where it sets no maxItems


def parse_structured(raw: AIMessage, schema: type[M], limit: int | None = None) -> M:
    """Validate a reply against `schema`, from a tool call or from JSON in the text."""
    if raw.response_metadata.get("finish_reason") == "length":
        raise cut_off(raw, limit)
    text: str | None = None  # what the value was read from (a tool call's: already read)
    if raw.tool_calls:
        candidate: Any = raw.tool_calls[0]["args"]
    elif raw.invalid_tool_calls:
        if limit and _written(raw) >= limit:  # llama.cpp says "tool_calls" even when cut
            raise cut_off(raw, limit)
        text = raw.invalid_tool_calls[0].get("args") or ""
        candidate = tolerant_json(text, raw)
    else:
        text = content_of(raw)
        candidate = tolerant_json(text, raw)
    unwritable = lone_surrogate(candidate, text)
    if unwritable:
        raise output_error(unwritable, raw)
    return _validated(schema, candidate, raw)


def _validated(schema: type[M], candidate: Any, raw: AIMessage) -> M:
    try:
        return schema.model_validate(candidate)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()
        )
        raise output_error(f"the reply failed validation: {problems}", raw) from None


# A character no UTF-8 file can hold, or a JSON escape that may make one.
_SURROGATE = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")


def lone_surrogate(value: Any, text: str | None = None) -> str | None:
    """Why a reply's JSON value cannot be written (a lone surrogate in one of its strings:
    "\\ud800" is half of a character, which UTF-8 has no bytes for), else None. With the
    `text` it was read from, a text that holds no surrogate nor its escape is not looked into."""
    if text is not None and not _SURROGATE.search(text):
        return None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"the reply holds {exc.object[exc.start : exc.end]!a}, half of a character "
            "(a lone surrogate), which no UTF-8 file can hold"
        )
    except (TypeError, ValueError):  # not JSON data: validation says what it is
        return None
    return None


def _written(raw: AIMessage) -> int:
    usage = raw.usage_metadata
    return int(usage["output_tokens"]) if usage else 0


def cut_off(raw: AIMessage, limit: int | None) -> LLMError:
    """A reply cut at its length: at max_tokens (re-asked, shorter), or well below it, where
    the server's context window filled up (the same prompt would be cut again: not re-asked)."""
    written, usage = _written(raw), raw.usage_metadata
    if limit and usage and written < CONTEXT_FULL * limit:
        prompt = int(usage["input_tokens"])
        full = ContextFull(
            f"the reply was cut off at {written} tokens, below max_tokens {limit}: the "
            f"server's context window was full ({prompt} prompt tokens + the reply); start "
            "the server with a larger context (llama.cpp: --n_ctx) or send shorter chunks "
            "(--max-chunk-chars)",
            raw=shown(raw),
        )
        full.raw_message = raw  # type: ignore[attr-defined]  # its tokens were billed all the same
        return full
    return output_error(CUT_OFF, raw)


@cache  # a class's JSON schema is fixed, and building it costs ~0.4 ms: once, not per call
def schema_tokens(schema: type[BaseModel]) -> int:
    """Tokens a reply of `schema` needs, with room: each field's allowance and JSON's framing."""
    root = schema.model_json_schema()
    return round(_tokens(root, root, 0) * 1.25) + 32


def _tokens(node: Any, root: dict[str, Any], depth: int) -> float:
    while isinstance(node, dict) and ("$ref" in node or "anyOf" in node):
        if "$ref" in node:
            node = root.get("$defs", {}).get(str(node["$ref"]).rsplit("/", 1)[-1], {})
        else:
            node = next((o for o in node["anyOf"] if o.get("type") != "null"), {})
    kind = node.get("type") if isinstance(node, dict) else None
    if depth > 6 or not isinstance(node, dict):
        return 8
    if kind == "object" or "properties" in node:
        fields = node.get("properties") or {}
        return 4 + sum(4 + _tokens(sub, root, depth + 1) for sub in fields.values())
    if kind == "array":
        items = int(node.get("maxItems", ARRAY_ITEMS))
        return 2 + items * _tokens(node.get("items"), root, depth + 1)
    if kind == "string":
        longest = node.get("maxLength")
        return 2 + (int(longest) / 3 if longest else STRING_TOKENS)
    return 6


def tolerant_json(text: str, raw: AIMessage | None = None) -> Any:
    """The first JSON object in text, allowing code fences and prose around it."""
    start = text.find("{")
    if start < 0:
        raise output_error("the reply holds no JSON object", raw)
    try:
        value, _ = _TOLERANT.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise output_error(f"the reply is not valid JSON ({exc.msg})", raw) from None
    except (ValueError, RecursionError):  # an integer of 5,000 digits, or [[[[...
        raise output_error(
            "the reply is JSON nested too deep, or with a number too long", raw
        ) from None
    return value


def exact_json(text: str) -> Any:
    """The JSON object a reply is, when it is that and nothing else, read fast; None when it
    is not (fenced, with prose, raw newlines in its strings): tolerant_json reads it then.
    The object is the one tolerant_json reads, but for an integer past 64 bits, read as a
    float (orjson's way): a bounded number, as every grade is, fails validation either way."""
    if text[:1] != "{":
        return None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return data if type(data) is dict else None


def output_error(reason: str, raw: AIMessage | None) -> OutputError:
    """An invalid reply: it keeps what the model sent, and the message (for its token usage)."""
    error = OutputError(reason, raw=shown(raw) if raw is not None else None)
    error.raw_message = raw  # type: ignore[attr-defined]
    return error


def shown(raw: AIMessage) -> str:
    """What the model sent: its text, else its tool-call arguments."""
    text = content_of(raw)
    if text or not (raw.tool_calls or raw.invalid_tool_calls):
        return text
    if raw.tool_calls:
        return json.dumps([call["args"] for call in raw.tool_calls])
    return "".join(str(call.get("args") or "") for call in raw.invalid_tool_calls)


def content_of(raw: BaseMessage) -> str:
    """A message's text, whether its content is a string or a list of parts."""
    content = raw.content
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)


def reask(messages: list[BaseMessage], exc: OutputError) -> list[BaseMessage]:
    """The original conversation, its last user message ending with one short note on why.

    The invalid reply is not echoed: a cut-off one would make every re-ask longer, and a
    second user message in a row breaks chat templates that insist on alternating roles.
    """
    if CUT_OFF in exc.reason:
        note = "Your previous reply to this was cut off at the length limit. Reply again, shorter."
    else:
        note = (
            f"Your previous reply to this was invalid: {exc.reason[:300]}. Reply again, correctly."
        )
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], HumanMessage):
            text = f"{content_of(messages[index])}\n\n({note})"
            return [*messages[:index], HumanMessage(content=text), *messages[index + 1 :]]
    return [*messages, HumanMessage(content=note)]


@cache
def _schema_text(schema: type[BaseModel]) -> str:
    return json.dumps(schema.model_json_schema(), indent=1)


def with_schema(
    messages: list[BaseMessage], schema: type[BaseModel], method: StructuredMethod
) -> list[BaseMessage]:
    """In json_mode and prompt mode the server does not know the schema: the prompt says it."""
    if method not in (StructuredMethod.json_mode, StructuredMethod.prompt):
        return messages
    spec = _schema_text(schema)
    note = f"Reply with one JSON object that follows this JSON schema:\n```json\n{spec}\n```"
    # Appended to the first system message: many chat templates reject a later one.
    first, rest = messages[0], messages[1:]
    if isinstance(first, SystemMessage):
        return [SystemMessage(content=f"{first.content}\n\n{note}"), *rest]
    return [SystemMessage(content=note), *messages]


# The methods in the order they are tried: a refused method, or one whose replies keep
# failing validation, gives way to the next untried one (then to an earlier untried one).
ORDER = (
    StructuredMethod.json_schema,
    StructuredMethod.function_calling,
    StructuredMethod.json_mode,
    StructuredMethod.prompt,
)
OUTCOME_TRIES = 3  # replies of a method, none valid, before the next method is tried
# ... on the batch road, where the first replies read are those the merge meets first, not a
# sample: a switch there makes every paid, valid result of the method unusable
HELD_TRIES = 20
# The request fields each method adds: a refusal whose message names one blames the method.
METHOD_FIELDS = {
    StructuredMethod.json_schema: ("response_format", "json_schema"),
    StructuredMethod.function_calling: ("tools", "tool_choice", "function"),
    StructuredMethod.json_mode: ("response_format", "json_object"),
}
# Statuses that say nothing about the request's fields, whatever their message echoes.
NOT_ABOUT_FIELDS = frozenset({401, 403, 408, 409, 429})


class MethodRefused(Exception):
    """The endpoint refused a call because of its structured-output method; retry on the next."""


def says_unsupported(method: StructuredMethod, exc: BaseException) -> bool:
    """True when a refusal of any status names a request field that `method` adds.

    llama-cpp-python answers a json_schema response_format with HTTP 500 and a pydantic error
    naming `response_format`; others answer 400 or 422: the status alone tells nothing.
    """
    if method not in METHOD_FIELDS or not isinstance(exc, openai.APIStatusError):
        return False
    if exc.status_code in NOT_ABOUT_FIELDS:
        return False
    text = f"{exc.message} {exc.body}".lower()
    return any(field in text for field in METHOD_FIELDS[method])


class MethodChoice:
    """A stage's structured-output method: settled by its first call, switched by outcome.

    Until a call settles the method, calls go one at a time, so a refusal is met once and the
    method switched once, not by every call in flight. A method is left for the next untried
    one when the endpoint refuses it (of any status: llama.cpp answers 500), or when its
    first OUTCOME_TRIES replies all fail validation (a small model that echoes the schema
    back in JSON mode may fill a tool call's arguments correctly).

    On the batch road (`batched`), the replies come back all at once, for requests all made
    under the method, and the first read are those the merge meets first: within a pass it is
    left for invalid replies only after HELD_TRIES of them, none valid; at the pass's end,
    after OUTCOME_TRIES (pass_ended).
    """

    def __init__(self, method: StructuredMethod) -> None:
        self.method = method
        self.tried = {method}
        self.settled = self._next(method) is None
        self.valid: dict[StructuredMethod, int] = {}
        self.invalid: dict[StructuredMethod, int] = {}
        self.batched = False
        self._lock = asyncio.Lock()

    def _failing(self, method: StructuredMethod, counts: dict[StructuredMethod, int]) -> bool:
        """Whether the method has had enough of these failures, and no valid reply."""
        tries = HELD_TRIES if self.batched else OUTCOME_TRIES
        return not self.valid.get(method) and counts.get(method, 0) >= tries

    def _next(self, method: StructuredMethod) -> StructuredMethod | None:
        at = ORDER.index(method)
        later = [m for m in (*ORDER[at + 1 :], *ORDER[:at]) if m not in self.tried]
        return later[0] if later else None

    def _switch(self, method: StructuredMethod) -> bool:
        """Leave `method` for the next untried one; False when none is left."""
        following = self._next(method)
        if following is None:
            return False
        self.method, self.settled = following, False
        self.tried.add(following)
        return True

    @asynccontextmanager
    async def attempt(self) -> AsyncIterator[StructuredMethod]:
        """The method for one call; a refusal of it raises MethodRefused from the HTTP error."""
        held = False
        if not self.settled:
            await self._lock.acquire()
            held = not self.settled  # settled while we waited: go on without the lock
            if not held:
                self._lock.release()
        method = self.method
        try:
            yield method
        except Exception as exc:
            self._failed(method, exc)
            raise
        else:
            self.settled = self.settled or self.method == method
        finally:
            if held:
                self._lock.release()

    def succeeded(self, method: StructuredMethod, replies: int = 1) -> None:
        """Calls under `method` gave valid replies: booked as `attempt` and `outcome` book one."""
        self.valid[method] = self.valid.get(method, 0) + replies
        self.settled = self.settled or self.method == method

    def outcome(self, method: StructuredMethod, valid: bool) -> bool:
        """Book a reply under `method`; True when its replies failing switched the method."""
        counts = self.valid if valid else self.invalid
        counts[method] = counts.get(method, 0) + 1
        failing = self._failing(method, self.invalid)
        return not valid and failing and self.method == method and self._switch(method)

    def pass_ended(self) -> bool:
        """On the batch road, once a pass has read all its results: leave the method when
        OUTCOME_TRIES or more of its replies failed and none passed (the rule the sync road
        applies to its first replies, here on the whole pass, not on the first read)."""
        method = self.method
        failing = not self.valid.get(method) and self.invalid.get(method, 0) >= OUTCOME_TRIES
        return self.batched and failing and self._switch(method)

    def _failed(self, method: StructuredMethod, exc: Exception) -> None:
        if not says_unsupported(method, exc):
            self.settled = self.settled or self.method == method  # the method is not to blame
            return
        if self.method == method and not self._switch(method):  # the first to meet it
            return  # no method left: the refusal is the row's error
        raise MethodRefused(str(exc)) from exc
