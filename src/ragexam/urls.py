"""URLs given by the user: checked once, and masked wherever they are shown or stored.

A URL may carry credentials, as `user:password@host` or as a key in its query string
(`?api-key=...`); both are masked in messages, manifests and output files.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

# Query parameters that carry secrets (Azure's api-key, key=, token=, sig=, ...).
_SECRET_QUERY = re.compile(
    r"([?&](?:api[-_]?key|key|token|access[-_]?token|secret|sig|signature|password|code)=)"
    r"[^&#\s\"']+",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"(\w+://)[^/@\s\"']+@")


def parse_http_url(url: str, name: str) -> SplitResult:
    """The parts of an http(s) URL, or ValueError naming the setting and what a good one is."""
    example = f"{name} must be a URL like http://localhost:8000 (got {mask_url(url)!r})"
    try:
        parts = urlsplit(url.strip())
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        raise ValueError(example) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ValueError(example)
    return parts


def mask_url(text: str) -> str:
    """Text with the credentials of every URL in it masked: userinfo and secret query values."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))
