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
    """An instant as ISO 8601 with the offset of `tz`, to the second: how times are exchanged (the API,
    MCP, the model's prompts and tool results, the bot's own messages)."""
    return value.astimezone(tz).isoformat(timespec="seconds")


# How the console shows an instant: date, time, and the zone's offset (`2026-12-24 08:00:00 +0800`).
# Django's DATETIME_FORMAT (console/formats) is the same format, so a page whose times come from the
# admin's own rendering and from this function shows one format.
SHOWN_FORMAT = "%Y-%m-%d %H:%M:%S %z"


def format_shown(value: datetime, tz: tzinfo) -> str:
    """An instant as the console shows it, in `tz` (the bot's time zone) with its offset visible."""
    return value.astimezone(tz).strftime(SHOWN_FORMAT)
