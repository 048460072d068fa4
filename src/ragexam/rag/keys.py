"""Where keys may go: only to the hosts the user named for their endpoints.

A collection's persisted embedding function carries its own endpoint (`api_base`) and the
name of the environment variable its key is read from. A store made by someone else could
point that at their server and collect the user's key; so a function that sends a key to a
host other than those of OPENAI_BASE_URL and RAGEXAM_EMBEDDING_BASE_URL is refused unless
the user trusts the store's endpoint.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ragexam.config import Settings
from ragexam.errors import ConfigError
from ragexam.urls import mask_url

OPENAI_HOST = "api.openai.com"
ENDPOINT_KEYS = ("api_base", "base_url", "api_url", "url", "endpoint")


def allowed_hosts(settings: Settings) -> set[str]:
    """The hosts the user named for their endpoints (OpenAI's own when none is set)."""
    urls = [settings.openai_base_url or f"https://{OPENAI_HOST}", settings.embedding_base_url]
    return {host for url in urls if url and (host := _host(url))}


def function_endpoint(function: Any) -> tuple[str | None, str | None]:
    """A Chroma embedding function's endpoint URL (if it names one) and its key variable."""
    get_config = getattr(function, "get_config", None)
    config = get_config() if callable(get_config) else {}
    if not isinstance(config, dict):
        return None, None
    url = next((str(config[key]) for key in ENDPOINT_KEYS if config.get(key)), None)
    key_variable = config.get("api_key_env_var")
    return url, str(key_variable) if key_variable else None


def check_key_destination(function: Any, name: str, settings: Settings, trust: bool) -> str | None:
    """The function's endpoint, for the manifest; ConfigError when it would send a key elsewhere."""
    url, key_variable = function_endpoint(function)
    default = f"https://{OPENAI_HOST}/v1" if "openai" in name.lower() else None
    endpoint = url or default
    if key_variable is None or trust:
        return mask_url(endpoint) if endpoint else None
    host = _host(endpoint) if endpoint else None
    if host is None or host not in allowed_hosts(settings):
        where = host or f"the default endpoint of {name}"
        raise ConfigError(
            f"the collection's embedding function ({name}) would send {key_variable} to "
            f"{where}, which is not the host of OPENAI_BASE_URL or RAGEXAM_EMBEDDING_BASE_URL; "
            "pass --trust-store-endpoint if you trust it, or --embedding openai:MODEL"
        )
    return mask_url(endpoint) if endpoint else None


def _host(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return f"{parts.hostname}:{port}" if port else parts.hostname
