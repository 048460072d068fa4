"""What a 200 from a chat endpoint must hold before it is read as a completion.

Gateways and proxies answer 200 with an HTML page, an empty body, `{}` or no choices; a model
may answer with no content at all, or be stopped by a content filter. These are checked on the
raw HTTP response, before the SDK parses it, so each is a one-line reason on its row:
an invalid reply is retried like any other; a reply with no answer is not.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai

CHAT_PATH = "/chat/completions"
TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")
# The token counts of a completion's usage details that langchain-openai reads.
DETAILS = {
    "prompt_tokens_details": ("audio_tokens", "cached_tokens", "cache_write_tokens"),
    "completion_tokens_details": ("audio_tokens", "reasoning_tokens"),
}


# OpenAIError subclasses: the SDK passes them on as they are, without wrapping them.
class InvalidReply(openai.OpenAIError):
    """A 200 that is not a chat completion: retried, then an error row."""


class NotAnApi(InvalidReply):
    """A 2xx whose body is not JSON at all (an HTML page, nothing): if every call meets one,
    no OpenAI-compatible API answers at that URL."""


class NoAnswer(openai.OpenAIError):
    """A well-formed completion that holds no answer (content filter, null content)."""


async def check_reply(response: httpx2.Response) -> None:
    """An httpx response hook: raise when a chat completion's 2xx is not a usable completion
    (the SDK reads any 2xx as one)."""
    status = response.status_code
    if not 200 <= status < 300 or not response.request.url.path.endswith(CHAT_PATH):
        return
    await response.aread()
    content_type = response.headers.get("content-type", "")
    choice = first_choice(response.content, content_type, status)
    no_answer = missing_answer(choice)
    if no_answer:
        raise NoAnswer(no_answer)


def first_choice(body: bytes, content_type: str, status: int = 200) -> dict[str, Any]:
    """The first choice of a completion body, or InvalidReply saying what came instead."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
        kind = "an empty body" if not body.strip() else f"a body that is not JSON ({content_type})"
        raise NotAnApi(
            f"the endpoint answered HTTP {status} with {kind}, not a completion; "
            "is a gateway or proxy in the way?"
        ) from None
    return choice_of(data, status)


def choice_of(data: Any, status: int = 200) -> dict[str, Any]:
    """The first choice of a completion already read as JSON, or InvalidReply saying why not."""
    answered = f"the endpoint answered HTTP {status} with"
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise InvalidReply(f"{answered} a completion without choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise InvalidReply(f"{answered} a choice without a message")
    odd = unreadable(data)
    if odd:
        raise InvalidReply(f"{answered} a completion whose {odd}")
    return choice


def unreadable(data: dict[str, Any]) -> str | None:
    """What in a completion langchain-openai's reader (or ragexam's count of its tokens) could
    not read, or None. Such a reply, from a proxy or a server of its own ways, is an invalid
    reply on its row: it must never stop the stage. (~1 µs: it reads every batch result.)"""
    error = data.get("error")
    if error:  # langchain-openai raises it, whatever the choices say
        said = error.get("message") or error if isinstance(error, dict) else error
        return f"error says: {' '.join(str(said).split())[:200]}"
    for number, choice in enumerate(data["choices"]):
        message = choice.get("message") if type(choice) is dict else None
        if type(message) is not dict:
            return f"choices[{number}].message is missing"
        odd = _odd_message(message)
        if odd:
            return f"choices[{number}].message{odd}"
    return _odd_usage(data.get("usage"))


def _odd_message(message: dict[str, Any]) -> str | None:
    """What in a message is not as langchain reads it, from its own name on."""
    get = message.get
    if get("role") != "assistant":
        return f".role is {get('role')!r}, not 'assistant'"
    content, name, known = get("content"), get("name"), get("id")
    if not (content is None or type(content) is str or _parts(content)):
        return ".content is neither text, a list of parts, nor null"
    if name is not None and type(name) is not str:
        return ".name is not text"
    if not (known is None or type(known) in (str, int)):
        return ".id is neither text nor a number"
    calls = get("tool_calls")
    if calls is not None and not (type(calls) is list and all(map(_tool_call, calls))):
        return ".tool_calls are not a list of function calls with object arguments"
    call = get("function_call")
    if call is not None and type(call) is not dict:
        return ".function_call is not an object"
    return None


def _parts(content: Any) -> bool:
    """Content as a list of parts (Mistral's reasoning models: thinking, then text)."""
    return type(content) is list and all(type(part) in (str, dict) for part in content)


def _tool_call(call: Any) -> bool:
    """Whether langchain can read a tool call: a function's name, and arguments that are an
    object as JSON (or not JSON at all: it keeps those as an invalid call)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not (
        isinstance(function, dict)
        and "name" in function  # langchain reads both, even to keep an invalid call
        and "arguments" in function
        and isinstance(function.get("name"), str | None)
        and isinstance(function.get("arguments"), str | None)
        and isinstance(call.get("id"), str | None)
    ):
        return False
    try:
        arguments = json.loads(function["arguments"] or "{}", strict=False)
    except (ValueError, RecursionError):
        return True
    return not arguments or isinstance(arguments, dict)  # `[]` or `null`: read as no arguments


def _odd_usage(usage: Any) -> str | None:
    """What in a completion's usage is not token counts."""
    if not usage:  # langchain reads `[]` or `{}` as no usage
        return None
    if type(usage) is not dict:
        return "usage is not an object"
    for name in TOKENS:
        if not _count(usage.get(name)):
            return f"usage.{name} is not a whole number"
    for name, counts in DETAILS.items():
        details = usage.get(name)
        if not details:
            continue
        if type(details) is not dict:
            return f"usage.{name} is not an object"
        odd = next((count for count in counts if not _count(details.get(count))), None)
        if odd:
            return f"usage.{name}.{odd} is not a whole number"
    return None


def _count(value: Any) -> bool:
    return value is None or type(value) is int  # a bool is not a count


def missing_answer(choice: dict[str, Any]) -> str | None:
    """Why a choice holds no answer, or None when it holds one (an empty text is an answer)."""
    reason = choice.get("finish_reason")
    message = choice["message"]
    if reason == "content_filter":
        return "the endpoint's content filter withheld the reply (finish_reason=content_filter)"
    if message.get("content") is None and not message.get("tool_calls"):
        refusal = message.get("refusal")
        said = f"; it refused: {' '.join(str(refusal).split())[:200]}" if refusal else ""
        return f"the model returned no content (finish_reason={reason}){said}"
    return None
