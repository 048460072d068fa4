"""Structured output: read a model's reply as a validated pydantic object, or say why not.

Replies are parsed tolerantly (a tool call, or the first JSON object in the text, code fences
and prose around it allowed), then validated. An invalid reply is shown back to the model
with the reason (instructor-style re-ask); a server that cannot take the schema gets it in the
prompt instead.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, TypeVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ValidationError

from ragexam.config import StructuredMethod
from ragexam.errors import OutputError

M = TypeVar("M", bound=BaseModel)


def parse_structured(raw: AIMessage, schema: type[M]) -> M:
    """Validate a reply against `schema`, from a tool call or from JSON in the text."""
    if raw.response_metadata.get("finish_reason") == "length":
        raise _output_error("the reply was cut off (finish_reason=length)", raw)
    if raw.tool_calls:
        candidate: Any = raw.tool_calls[0]["args"]
    elif raw.invalid_tool_calls:
        candidate = tolerant_json(raw.invalid_tool_calls[0].get("args") or "", raw)
    else:
        candidate = tolerant_json(content_of(raw), raw)
    try:
        return schema.model_validate(candidate)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'reply'}: {e['msg']}" for e in exc.errors()
        )
        raise _output_error(f"the reply failed validation: {problems}", raw) from None


def tolerant_json(text: str, raw: AIMessage | None = None) -> Any:
    """The first JSON object in text, allowing code fences and prose around it."""
    start = text.find("{")
    if start < 0:
        raise _output_error("the reply holds no JSON object", raw)
    try:
        value, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _output_error(f"the reply is not valid JSON ({exc.msg})", raw) from None
    return value


def _output_error(reason: str, raw: AIMessage | None) -> OutputError:
    error = OutputError(reason, raw=content_of(raw) if raw is not None else None)
    error.raw_message = raw  # type: ignore[attr-defined]
    return error


def content_of(raw: AIMessage) -> str:
    content = raw.content
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)


def reask(raw: AIMessage, exc: OutputError) -> list[BaseMessage]:
    """Messages that show the model its invalid reply and ask again (instructor-style)."""
    shown = content_of(raw) or json.dumps([call["args"] for call in raw.tool_calls])
    return [
        AIMessage(content=shown[:4000]),
        HumanMessage(content=f"That reply was invalid: {exc.reason}. Reply again, correctly."),
    ]


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
