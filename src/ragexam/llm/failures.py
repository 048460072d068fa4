"""What a failed call means: its one-line reason, whether a 429 means "not now", and how long
the server asked to wait."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import openai

from ragexam.llm.endpoint import root_cause

MAX_RETRY_AFTER = 120.0


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed call."""
    if isinstance(exc, openai.APIStatusError):
        message = exc.message
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            message = body["message"]
        text = f"HTTP {exc.status_code}: {message}"
    elif isinstance(exc, openai.APITimeoutError):
        text = "the call timed out (RAGEXAM_TIMEOUT)"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"cannot connect to the endpoint: {root_cause(exc)}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:500]


def rate_limited(exc: BaseException) -> bool:
    """A 429 that means "not now", as opposed to insufficient_quota, which means "no"."""
    if not isinstance(exc, openai.RateLimitError):
        return False
    body = exc.body if isinstance(exc.body, dict) else {}
    return "insufficient_quota" not in (getattr(exc, "code", None), body.get("code"))


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms), if it said."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        seconds: float | None
        try:
            seconds = float(value) * scale
        except ValueError:
            seconds = _until(value) if name == "retry-after" else None
        if seconds is not None:
            return min(max(seconds, 0.0), MAX_RETRY_AFTER)
    return None


def _until(date: str) -> float | None:
    """Seconds from now to an HTTP date (Retry-After's other form), None for no date."""
    try:
        when = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110's dates are GMT
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()
