"""The one time parser: absolute instants (ISO 8601) and timer specs (`30s`, `once:…`, `cron:…`)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, tzinfo


class TimeSpecError(ValueError):
    """The text is not a time we understand; the message says what is wrong."""


def parse_instant(value: str, tz: tzinfo) -> datetime:
    """An ISO 8601 date-time as an aware UTC datetime.

    With an offset (or `Z`) it is that instant; without one it is read in `tz`. A wall time that
    does not exist in `tz` (skipped by a clock change) is an error rather than a silent guess.
    """
    if not isinstance(value, str) or not value.strip():
        raise TimeSpecError("no time given; expected ISO 8601 such as 2026-04-10T09:00:00+08:00")
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise TimeSpecError(
            f"{value!r} is not an ISO 8601 date-time; expected e.g. 2026-04-10T09:00:00+08:00"
        ) from None
    if len(text) <= 10:  # a bare date: "send at 2026-04-10" has no time of day to send at
        raise TimeSpecError(f"{value!r} has no time of day; expected e.g. {text}T09:00")
    if parsed.tzinfo is None:
        local = parsed.replace(tzinfo=tz)
        # Round-trip through UTC: a wall time inside a DST gap comes back different.
        if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != parsed:
            raise TimeSpecError(f"{value!r} does not exist in {tz} (the clocks skip it)")
        parsed = local
    return parsed.astimezone(UTC)


def format_instant(value: datetime, tz: tzinfo) -> str:
    """An instant as ISO 8601 with the offset of `tz`, to the second."""
    return value.astimezone(tz).isoformat(timespec="seconds")


# --- spoken times ("in 10 minutes", "at 8:30", "10分钟后", "明天早上8点") ------------------------------
# For the offline planner's small documented phrase set (chat/offline.py). A bare clock time that
# has already passed today means tomorrow; "today" with a past time is an error.

_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_ZH_NUM = r"[零一二两三四五六七八九十百]+"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ISO_PREFIX = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?", re.I)
_EN_REL = re.compile(
    r"in\s+(?:half\s+an\s+hour|(?:(?:\d+|an?|one)\s*"
    r"(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|s|m|h|d)(?![a-z])\s*(?:and\s+|,\s*)?)+)",
    re.I,
)
_EN_REL_PART = re.compile(r"(\d+|an?|one)\s*(seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|s|m|h|d)(?![a-z])", re.I)
_EN_ABS = re.compile(
    r"(?:(?P<day1>today|tomorrow)\s+)?(?P<at>at\s+)?(?P<h>\d{1,2})(?::(?P<mi>\d{2}))?\s*(?P<ap>am|pm|a\.m\.|p\.m\.)?"
    r"(?:\s+(?P<day2>today|tomorrow))?(?![\d:])",
    re.I,
)
_ZH_REL = re.compile(rf"(?P<n>\d+|{_ZH_NUM}|半)\s*个?\s*(?P<u>秒钟|秒|分钟|分|小时|钟头|天)\s*(?:以后|之后|后)")
_ZH_ABS = re.compile(
    r"(?P<day>今天|明天|后天)?\s*(?P<period>早上|早晨|上午|中午|下午|晚上|傍晚|凌晨|今晚|明早|明晚)?\s*"
    rf"(?P<h>\d{{1,2}}|{_ZH_NUM})\s*(?:点|:|：|时)\s*(?:(?P<half>半)|(?P<mi>\d{{1,2}}|{_ZH_NUM})\s*分?)?"
)


def _zh_number(text: str) -> int:
    if text.isdigit():
        return int(text)
    if "百" in text:
        head, _, tail = text.partition("百")
        return (_ZH_DIGITS.get(head, 1) if head else 1) * 100 + (_zh_number(tail) if tail else 0)
    if "十" in text:
        head, _, tail = text.partition("十")
        return (_ZH_DIGITS[head] if head else 1) * 10 + (_ZH_DIGITS[tail] if tail else 0)
    value = 0
    for ch in text:
        value = value * 10 + _ZH_DIGITS[ch]
    return value


def _en_unit(unit: str) -> int:
    unit = unit.lower()
    return _UNIT_SECONDS["m" if unit.startswith("mi") or unit == "m" else unit[0]]


def _at_clock(now_local: datetime, hour: int, minute: int, day: str | None, tz: tzinfo) -> datetime:
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        raise TimeSpecError(f"{hour}:{minute:02d} is not a time of day")
    offset = {"today": 0, "tomorrow": 1, "day_after": 2}.get(day or "", 0)
    date = (now_local + timedelta(days=offset)).date()
    wall = datetime(date.year, date.month, date.day, hour, minute)
    when = parse_instant(wall.isoformat(), tz)
    if when <= now_local:
        if day:
            raise TimeSpecError(f"{format_instant(when, tz)} has already passed")
        when = parse_instant((wall + timedelta(days=1)).isoformat(), tz)
    return when


def _parse_match(kind: str, m: re.Match, tz: tzinfo, now: datetime) -> datetime:
    now_local = now.astimezone(tz)
    if kind == "iso":
        return parse_instant(m.group(0), tz)
    if kind == "en_rel":
        text = m.group(0)
        if re.search(r"half\s+an\s+hour", text, re.I):
            return now + timedelta(minutes=30)
        seconds = sum(
            (1 if n.lower() in {"a", "an", "one"} else int(n)) * _en_unit(u) for n, u in _EN_REL_PART.findall(text)
        )
        return now + timedelta(seconds=seconds)
    if kind == "zh_rel":
        n, unit = m.group("n"), m.group("u")
        per = {"秒": 1, "秒钟": 1, "分": 60, "分钟": 60, "小时": 3600, "钟头": 3600, "天": 86400}[unit]
        amount = 0.5 if n == "半" else _zh_number(n)
        return now + timedelta(seconds=amount * per)
    if kind == "en_abs":
        day = (m.group("day1") or m.group("day2") or "").lower() or None
        hour, minute = int(m.group("h")), int(m.group("mi") or 0)
        ap = (m.group("ap") or "").lower().replace(".", "")
        if ap:
            if not 1 <= hour <= 12:
                raise TimeSpecError(f"{m.group(0)!r} is not a time")
            hour = hour % 12 + (12 if ap == "pm" else 0)
        return _at_clock(now_local, hour, minute, day, tz)
    # zh_abs
    day = {"今天": "today", "明天": "tomorrow", "后天": "day_after"}.get(m.group("day") or "")
    period = m.group("period") or ""
    if period in {"明早", "明晚"}:
        day = day or "tomorrow"
    if period == "今晚":
        day = day or "today"
    hour = _zh_number(m.group("h"))
    minute = 30 if m.group("half") else (_zh_number(m.group("mi")) if m.group("mi") else 0)
    if period in {"下午", "晚上", "傍晚", "今晚", "明晚"} and hour < 12:
        hour += 12
    elif period == "中午" and hour < 11:
        hour += 12
    return _at_clock(now_local, hour, minute, day, tz)


_SPOKEN = (("iso", _ISO_PREFIX), ("en_rel", _EN_REL), ("zh_rel", _ZH_REL), ("en_abs", _EN_ABS), ("zh_abs", _ZH_ABS))


def split_spoken_time(text: str, tz: tzinfo, *, now: datetime) -> tuple[datetime, str] | None:
    """The instant a text starts with, and the rest of the text; None when it starts with no time."""
    text = (text or "").strip()
    best: tuple[int, str, re.Match] | None = None
    for kind, pattern in _SPOKEN:
        m = pattern.match(text)
        if kind == "en_abs" and m and not (m.group("at") or m.group("mi") or m.group("ap") or m.group("day1")):
            m = None  # a bare number ("8 apples") is not a time
        if m and m.group(0).strip() and (best is None or m.end() > best[0]):
            best = (m.end(), kind, m)
    if best is None:
        return None
    end, kind, m = best
    return _parse_match(kind, m, tz, now), text[end:].strip()


def parse_spoken_time(text: str, tz: tzinfo, *, now: datetime) -> datetime:
    """A whole text that is a time: ISO 8601, "in 10 minutes", "at 8:30pm", "10分钟后", "明天早上8点"."""
    found = split_spoken_time(text, tz, now=now)
    if found is None or found[1]:
        raise TimeSpecError(
            f"{text!r} is not a time I understand; try 'in 10 minutes', 'at 8:30', '10分钟后' or ISO 8601"
        )
    return found[0]
