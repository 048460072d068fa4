"""Text that is safe to show on a terminal: no control character reaches it."""

from __future__ import annotations

import re

# C0 and C1 control characters, DEL included; tab and newline are kept.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text with control characters (terminal escapes among them) shown as '?'."""
    return CONTROL.sub("?", text)
