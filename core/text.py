"""Text from people and callers: what cannot be stored, and what shows nothing at all.

Every entry point that takes text (the API, the planner's and life loop's tools, the adapters, the
chat page) asks these two questions, so a lone surrogate never reaches the database (a 500 there) and
a message of zero-width spaces is "empty" everywhere, not only where `str.strip()` happens to see it.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, tzinfo

_SURROGATE = re.compile("[\ud800-\udfff]")

# Characters that occupy no space on screen: zero-width space/joiners, BOM, word joiner, bidi marks…
# (Unicode "format" characters) plus every kind of whitespace.
_INVISIBLE_CATEGORIES = {"Cf", "Zs", "Zl", "Zp", "Cc"}


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored as it is (a NUL, an unpaired surrogate), or None."""
    if "\x00" in text:
        return "must not contain NUL characters"
    if not text.isascii() and (found := _SURROGATE.search(text)):  # base64 media takes the fast path
        return f"contains an unpaired surrogate (U+{ord(found.group()):04X}), which is not valid text"
    return None


def is_blank(text: str) -> bool:
    """True when `text` shows nothing: only whitespace and zero-width characters."""
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE_CATEGORIES for ch in text)


def format_instant(value: datetime, tz: tzinfo) -> str:
    """An instant as ISO 8601 with the offset of `tz`, to the second (how every time is shown)."""
    return value.astimezone(tz).isoformat(timespec="seconds")
