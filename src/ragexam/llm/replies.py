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


# OpenAIError subclasses: the SDK passes them on as they are, without wrapping them.
class InvalidReply(openai.OpenAIError):
    """A 200 that is not a chat completion: retried, then an error row."""


class NoAnswer(openai.OpenAIError):
    """A well-formed completion that holds no answer (content filter, null content)."""


async def check_reply(response: httpx2.Response) -> None:
    """An httpx response hook: raise when a chat completion's 200 is not a usable completion."""
    if response.status_code != 200 or not response.request.url.path.endswith(CHAT_PATH):
        return
    await response.aread()
    choice = first_choice(response.content, response.headers.get("content-type", ""))
    no_answer = missing_answer(choice)
    if no_answer:
        raise NoAnswer(no_answer)


def first_choice(body: bytes, content_type: str) -> dict[str, Any]:
    """The first choice of a completion body, or InvalidReply saying what came instead."""
    try:
        data = json.loads(body)
    except ValueError:
        kind = "an empty body" if not body.strip() else f"a body that is not JSON ({content_type})"
        raise InvalidReply(
            f"the endpoint answered HTTP 200 with {kind}, not a completion; "
            "is a gateway or proxy in the way?"
        ) from None
    return choice_of(data)


def choice_of(data: Any) -> dict[str, Any]:
    """The first choice of a completion already read as JSON, or InvalidReply saying why not."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices:
        raise InvalidReply("the endpoint answered HTTP 200 with a completion without choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise InvalidReply("the endpoint answered HTTP 200 with a choice without a message")
    return choice


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
