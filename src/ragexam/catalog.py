"""The endpoint's model list: a configured model the endpoint does not list gets a warning.

llama.cpp's server, and some proxies, answer every model name with the one model they have,
so a misspelt RAGEXAM_MODEL would go unnoticed. Where `GET /v1/models` answers, the model is
looked up there once, before a stage's first call. The warning goes to the `ragexam` logger;
the CLI shows it as one line.
"""

from __future__ import annotations

import logging

import openai

logger = logging.getLogger("ragexam")
LIST_TIMEOUT = 10.0
SHOWN = 5


async def listed_models(client: openai.AsyncOpenAI) -> list[str] | None:
    """The ids `GET /v1/models` lists, or None when the endpoint does not answer it."""
    try:
        page = await client.models.list(timeout=LIST_TIMEOUT)
    except (openai.OpenAIError, ValueError, TypeError):
        return None  # no listing (404, an old server, a proxy): nothing to check against
    ids = [str(getattr(model, "id", "")) for model in page.data]
    return [model_id for model_id in ids if model_id] or None


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


async def check_model(client: openai.AsyncOpenAI, model: str) -> None:
    """Warn, through the `ragexam` logger, when the endpoint does not list `model`."""
    warning = absent_model_warning(model, await listed_models(client))
    if warning is not None:
        logger.warning(warning)
