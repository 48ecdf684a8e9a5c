"""The one time parser: absolute instants (ISO 8601), timer specs (`30s`, `every:…`, `once:…`, `cron:…`)
and spoken times ("in 10 minutes", "10分钟后", "明天早上8点")."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum

from croniter import CroniterError, croniter

from core.config import format_instant


class TimeSpecError(ValueError):
    """The text is not a time we understand; the message says what is wrong."""


# The longest delay or interval anyone means (a timer, "in N days"): far beyond every configured
# horizon, yet far from where date arithmetic overflows.
MAX_SPAN = timedelta(days=365 * 100)


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
    try:
        if parsed.tzinfo is None:
            local = parsed.replace(tzinfo=tz)
            # Round-trip through UTC: a wall time inside a DST gap comes back different.
            if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != parsed:
                raise TimeSpecError(f"{value!r} does not exist in {tz} (the clocks skip it)")
            parsed = local
        return parsed.astimezone(UTC)
    except OverflowError:  # years 1 and 9999 with an offset fall off the calendar in UTC
        raise TimeSpecError(f"{value!r} is out of range") from None


# --- timer specs ----------------------------------------------------------------------------------
#
# A timer's spec is one of:
#   after   `30s`, `5min`, `2h`, `1d`, `1h30min`, `30秒`, `5分钟`, `2小时`, `1天`  → fires ONCE, that long after
#           it was set (a reminder "in five minutes"), then the timer is done.
#   every   `every:30min`, `every:1d`, `每2小时`                                   → fires repeatedly at that
#           interval; the first fire is one interval after it was set.
#   once    `once:2026-04-10 09:00` (bot's time zone) or `once:2026-04-10T09:00+08:00` → fires once.
#   cron    `cron:0 8 * * *` (standard 5 fields, in the bot's time zone)         → fires at every match.
#
# Cron is evaluated in local wall time and then converted, so `0 8 * * *` stays at 08:00 across DST
# changes. A wall time the clocks skip (spring forward) fires at the first instant after the gap,
# once however many matches fell inside it; a wall time that happens twice (fall back) fires on its
# first occurrence only, unless the hour field is a wildcard (`*`, `*/n`), where both occurrences
# are real, distinct times.

_UNIT_SECONDS = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "秒": 1,
    "秒钟": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "分": 60,
    "分钟": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "时": 3600,
    "小时": 3600,
    "个小时": 3600,
    "钟头": 3600,
    "个钟头": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "天": 86400,
    "日": 86400,
}
_SPEC_PREFIX = re.compile(r"^([A-Za-z]+)\s*[:：]\s*(.*)$", re.DOTALL)
_DURATION_PART = re.compile(r"(\d+)\s*([a-z\u4e00-\u9fff]+)")


class TimerKind(StrEnum):
    AFTER = "after"
    EVERY = "every"
    ONCE = "once"
    CRON = "cron"


@dataclass(frozen=True)
class TimerSpec:
    """A parsed timer spec. `text` is the normalized spec, `interval` set for after/every, `at` for
    once, `cron` (the 5 fields) for cron."""

    kind: TimerKind
    text: str
    interval: timedelta | None = None
    at: datetime | None = None
    cron: str = ""

    @property
    def repeats(self) -> bool:
        return self.kind in (TimerKind.EVERY, TimerKind.CRON)

    def first_fire(self, now: datetime, tz: tzinfo) -> datetime:
        """When a timer set at `now` fires first."""
        if self.kind in (TimerKind.AFTER, TimerKind.EVERY):
            return now + self.interval
        if self.kind == TimerKind.ONCE:
            return self.at
        return cron_next(self.cron, now, tz)

    def next_fire(self, due: datetime, now: datetime, tz: tzinfo) -> datetime | None:
        """After firing the instant `due` at `now`: the next fire, or None for a one-shot timer.

        A repeating timer that missed several periods (downtime) fires once for all of them and
        moves to its next time in the future: never a burst of catch-up fires.
        """
        if self.kind == TimerKind.EVERY:
            step = self.interval
            missed = max(0, int((now - due) / step))
            return due + step * (missed + 1)
        if self.kind == TimerKind.CRON:
            return cron_next(self.cron, max(now, due), tz)
        return None

    def upcoming(self, now: datetime, tz: tzinfo, count: int = 5) -> list[datetime]:
        """The next `count` fires from `now` (admin preview)."""
        out: list[datetime] = []
        when = self.first_fire(now, tz)
        while when is not None and len(out) < count:
            out.append(when)
            when = self.next_fire(when, when, tz)
        return out


def parse_duration(text: str) -> timedelta:
    """`30s`, `5min`, `1h30min`, `2小时`, `1天12小时` as a positive timedelta."""
    compact = text.strip().lower()
    if not compact:
        raise TimeSpecError("no duration given; expected e.g. 30s, 5min, 2h, 1d, 1h30min or 5分钟")
    pos = 0
    total = 0
    for match in _DURATION_PART.finditer(compact):
        gap = compact[pos : match.start()].strip()
        if gap:
            raise TimeSpecError(f"{text!r}: cannot read {gap!r}; expected e.g. 1h30min or 1小时30分钟")
        number, unit = match.groups()
        if unit not in _UNIT_SECONDS:
            raise TimeSpecError(f"{text!r}: unknown unit {unit!r}; use s, min, h, d (or 秒, 分钟, 小时, 天)")
        total += int(number) * _UNIT_SECONDS[unit]
        pos = match.end()
    rest = compact[pos:].strip()
    if pos == 0 or rest:
        raise TimeSpecError(
            f"{text!r} is not a duration; expected a number and a unit, e.g. 30s, 5min, 2h, 1d or 5分钟"
        )
    if total <= 0:
        raise TimeSpecError(f"{text!r} is zero; a timer needs a positive delay")
    if total > MAX_SPAN.total_seconds():
        raise TimeSpecError(f"{text!r} is longer than {MAX_SPAN.days // 365} years")
    return timedelta(seconds=total)


def _local_datetime(value: str, tz: tzinfo) -> datetime:
    """`2026-04-10 09:00` (bot's zone) or ISO 8601 with offset, via parse_instant."""
    return parse_instant(value.strip().replace("/", "-"), tz)


def parse_timer_spec(text: str, tz: tzinfo) -> TimerSpec:
    """Parse a timer spec (see the table above). Raises TimeSpecError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise TimeSpecError(
            "no timer spec given; expected e.g. 5min, every:1h, once:2026-04-10 09:00 or cron:0 8 * * *"
        )
    raw = text.strip()
    # `kind:` — a full-width colon too, as Chinese keyboards type it.
    match = _SPEC_PREFIX.match(raw)
    prefix, body = (match.group(1).lower(), match.group(2)) if match else ("", raw)
    if prefix == "once":
        try:
            at = _local_datetime(body, tz)
        except TimeSpecError as exc:
            raise TimeSpecError(f"once: {exc}") from None
        return TimerSpec(kind=TimerKind.ONCE, text=f"once:{body.strip()}", at=at)
    if prefix == "cron":
        expr = " ".join(body.split())
        _validate_cron(expr, tz)
        return TimerSpec(kind=TimerKind.CRON, text=f"cron:{expr}", cron=expr)
    if prefix == "every":
        interval = parse_duration(body)
        return TimerSpec(kind=TimerKind.EVERY, text=f"every:{body.strip()}", interval=interval)
    if prefix:
        raise TimeSpecError(
            f"{raw!r}: unknown spec kind {match.group(1)!r}; use once:, every: or cron: (or a delay like 5min)"
        )
    if raw.startswith("每"):
        interval = parse_duration(raw[1:])
        return TimerSpec(kind=TimerKind.EVERY, text=f"every:{raw[1:].strip()}", interval=interval)
    return TimerSpec(kind=TimerKind.AFTER, text=raw, interval=parse_duration(raw))


def _validate_cron(expr: str, tz: tzinfo) -> None:
    fields = expr.split()
    if len(fields) != 5:
        raise TimeSpecError(
            f"cron:{expr!r} has {len(fields)} fields; expected 5 (minute hour day month weekday), e.g. cron:0 8 * * *"
        )
    try:
        croniter(expr, datetime(2000, 1, 1))
    except CroniterError as exc:
        raise TimeSpecError(f"cron:{expr!r} is not a valid cron expression: {exc}") from None
    try:
        cron_next(expr, datetime.now(UTC), tz)
    except TimeSpecError:
        raise
    except CroniterError:
        raise TimeSpecError(f"cron:{expr!r} never matches a real date") from None


def _wall_instants(naive: datetime, tz: tzinfo, hour_wildcard: bool) -> list[datetime]:
    """The UTC instants at which a local wall time happens: none → the end of the gap; twice → the
    first (both with a wildcard hour)."""
    first = naive.replace(tzinfo=tz, fold=0)
    second = naive.replace(tzinfo=tz, fold=1)
    first_utc, second_utc = first.astimezone(UTC), second.astimezone(UTC)
    if first.utcoffset() == second.utcoffset():
        return [first_utc]
    if first_utc > second_utc:
        # A gap (spring forward): fold=0 reads it with the old offset, fold=1 with the new one;
        # the clocks jump at the instant the new offset begins, which is the earlier reading.
        return [_gap_end(second_utc, first_utc, tz)]
    return [first_utc, second_utc] if hour_wildcard else [first_utc]


def _gap_end(low: datetime, high: datetime, tz: tzinfo) -> datetime:
    """The first instant after the clocks jumped forward, between two UTC instants that bracket it."""
    before = low.astimezone(tz).utcoffset()
    # Transitions fall on whole minutes: bisect over minutes.
    lo, hi = low, high
    while hi - lo > timedelta(minutes=1):
        mid = lo + (hi - lo) / 2
        mid = mid.replace(second=0, microsecond=0)
        if mid <= lo:
            break
        if mid.astimezone(tz).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return hi.replace(second=0, microsecond=0) if hi.astimezone(tz).utcoffset() != before else high


def cron_next(expr: str, after: datetime, tz: tzinfo) -> datetime:
    """The first instant strictly after `after` (aware) whose wall time in `tz` matches `expr`."""
    # Cron matches whole minutes, so every `after` within one UTC minute has the same answer; caching
    # on the minute lets thousands of timers firing together share one croniter walk.
    minute = after.astimezone(UTC).replace(second=0, microsecond=0)
    if after == minute:
        return _cron_next(expr, after, tz)
    return _cron_next_cached(expr, minute, tz)


@functools.lru_cache(maxsize=8192)
def _cron_next_cached(expr: str, minute: datetime, tz: tzinfo) -> datetime:
    return _cron_next(expr, minute + timedelta(microseconds=1), tz)


def _cron_next(expr: str, after: datetime, tz: tzinfo) -> datetime:
    hour_wildcard = expr.split()[1].startswith("*")
    local = after.astimezone(tz)
    start = local.replace(tzinfo=None, fold=0)
    # Near a clock change wall time is not monotonic (after falling back, wall times already seen
    # come again): start a little earlier in wall time and keep the first instant after `after`.
    window = timedelta(hours=3)
    offsets = {(after + d).astimezone(tz).utcoffset() for d in (-window, timedelta(0), window)}
    if len(offsets) > 1:
        start -= window
    it = croniter(expr, start - timedelta(microseconds=1))
    best: datetime | None = None
    for _ in range(100_000):
        naive = it.get_next(datetime)
        instants = _wall_instants(naive, tz, hour_wildcard)
        later = [i for i in instants if i > after]
        if later and (best is None or later[0] < best):
            best = later[0]
        # Instants grow with wall time except inside a repeated hour; stop once past it.
        if (
            best is not None
            and len(instants) == 1
            and naive.replace(tzinfo=tz).utcoffset() == naive.replace(tzinfo=tz, fold=1).utcoffset()
        ):
            return best
    raise TimeSpecError(f"cron:{expr!r} has no next time")


# --- spoken times ("in 10 minutes", "at 8:30", "10分钟后", "明天早上8点") ------------------------------
# For the offline planner's small documented phrase set (chat/offline.py). A bare clock time that
# has already passed today means tomorrow; "today" with a past time is an error.

_SPOKEN_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_SPOKEN_ZH_NUM = r"[零一二两三四五六七八九十百]+"
_SPOKEN_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SPOKEN_ISO_PREFIX = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?", re.I)
_SPOKEN_EN_REL = re.compile(
    r"in\s+(?:half\s+an\s+hour|(?:(?:\d+|an?|one)\s*"
    r"(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|s|m|h|d)(?![a-z])\s*(?:and\s+|,\s*)?)+)",
    re.I,
)
_SPOKEN_EN_REL_PART = re.compile(
    r"(\d+|an?|one)\s*(seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|s|m|h|d)(?![a-z])", re.I
)
_SPOKEN_EN_ABS = re.compile(
    r"(?:(?P<day1>today|tomorrow)\s+)?(?P<at>at\s+)?(?P<h>\d{1,2})(?::(?P<mi>\d{2}))?\s*(?P<ap>am|pm|a\.m\.|p\.m\.)?"
    r"(?:\s+(?P<day2>today|tomorrow))?(?![\d:])",
    re.I,
)
_SPOKEN_ZH_REL = re.compile(
    rf"(?P<n>\d+|{_SPOKEN_ZH_NUM}|半)\s*个?\s*(?P<u>秒钟|秒|分钟|分|小时|钟头|天)\s*(?:以后|之后|后)"
)
_SPOKEN_ZH_ABS = re.compile(
    r"(?P<day>今天|明天|后天)?\s*(?P<period>早上|早晨|上午|中午|下午|晚上|傍晚|凌晨|今晚|明早|明晚)?\s*"
    rf"(?P<h>\d{{1,2}}|{_SPOKEN_ZH_NUM})\s*(?:点|:|：|时)\s*(?:(?P<half>半)|(?P<mi>\d{{1,2}}|{_SPOKEN_ZH_NUM})\s*分?)?"
)


def _spoken_zh_number(text: str) -> int:
    try:
        return _zh_number(text)
    except KeyError:  # 十十, 两两十…: not a numeral
        raise TimeSpecError(f"{text!r} is not a number") from None


def _zh_number(text: str) -> int:
    if text.isdigit():
        return int(text)
    if "百" in text:
        head, _, tail = text.partition("百")
        return (_SPOKEN_ZH_DIGITS.get(head, 1) if head else 1) * 100 + (_zh_number(tail) if tail else 0)
    if "十" in text:
        head, _, tail = text.partition("十")
        return (_SPOKEN_ZH_DIGITS[head] if head else 1) * 10 + (_SPOKEN_ZH_DIGITS[tail] if tail else 0)
    value = 0
    for ch in text:
        value = value * 10 + _SPOKEN_ZH_DIGITS[ch]
    return value


def _spoken_en_unit(unit: str) -> int:
    unit = unit.lower()
    return _SPOKEN_UNIT_SECONDS["m" if unit.startswith("mi") or unit == "m" else unit[0]]


def _spoken_at_clock(now_local: datetime, hour: int, minute: int, day: str | None, tz: tzinfo) -> datetime:
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


def _spoken_parse_match(kind: str, m: re.Match, tz: tzinfo, now: datetime) -> datetime:
    now_local = now.astimezone(tz)
    if kind == "iso":
        return parse_instant(m.group(0), tz)
    if kind in ("en_rel", "zh_rel"):
        return now + _spoken_span(kind, m)
    if kind == "en_abs":
        day = (m.group("day1") or m.group("day2") or "").lower() or None
        hour, minute = int(m.group("h")), int(m.group("mi") or 0)
        ap = (m.group("ap") or "").lower().replace(".", "")
        if ap:
            if not 1 <= hour <= 12:
                raise TimeSpecError(f"{m.group(0)!r} is not a time")
            hour = hour % 12 + (12 if ap == "pm" else 0)
        return _spoken_at_clock(now_local, hour, minute, day, tz)
    # zh_abs
    day = {"今天": "today", "明天": "tomorrow", "后天": "day_after"}.get(m.group("day") or "")
    period = m.group("period") or ""
    if period in {"明早", "明晚"}:
        day = day or "tomorrow"
    if period == "今晚":
        day = day or "today"
    hour = _spoken_zh_number(m.group("h"))
    minute = 30 if m.group("half") else (_spoken_zh_number(m.group("mi")) if m.group("mi") else 0)
    if period in {"下午", "晚上", "傍晚", "今晚", "明晚"} and hour < 12:
        hour += 12
    elif period == "中午" and hour < 11:
        hour += 12
    return _spoken_at_clock(now_local, hour, minute, day, tz)


def _spoken_span(kind: str, m: re.Match) -> timedelta:
    """How far ahead "in 10 minutes" / "10分钟后" is, refused beyond MAX_SPAN."""
    if kind == "en_rel":
        text = m.group(0)
        if re.search(r"half\s+an\s+hour", text, re.I):
            return timedelta(minutes=30)
        seconds = sum(
            (1 if n.lower() in {"a", "an", "one"} else int(n)) * _spoken_en_unit(u)
            for n, u in _SPOKEN_EN_REL_PART.findall(text)
        )
    else:
        n, unit = m.group("n"), m.group("u")
        per = {"秒": 1, "秒钟": 1, "分": 60, "分钟": 60, "小时": 3600, "钟头": 3600, "天": 86400}[unit]
        seconds = (0.5 if n == "半" else _spoken_zh_number(n)) * per
    if seconds > MAX_SPAN.total_seconds():
        raise TimeSpecError(f"{m.group(0).strip()!r} is more than {MAX_SPAN.days // 365} years away")
    return timedelta(seconds=seconds)


_SPOKEN = (
    ("iso", _SPOKEN_ISO_PREFIX),
    ("en_rel", _SPOKEN_EN_REL),
    ("zh_rel", _SPOKEN_ZH_REL),
    ("en_abs", _SPOKEN_EN_ABS),
    ("zh_abs", _SPOKEN_ZH_ABS),
)


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
    return _spoken_parse_match(kind, m, tz, now), text[end:].strip()


def parse_spoken_time(text: str, tz: tzinfo, *, now: datetime) -> datetime:
    """A whole text that is a time: ISO 8601, "in 10 minutes", "at 8:30pm", "10分钟后", "明天早上8点"."""
    found = split_spoken_time(text, tz, now=now)
    if found is None or found[1]:
        raise TimeSpecError(
            f"{text!r} is not a time I understand; try 'in 10 minutes', 'at 8:30', '10分钟后' or ISO 8601"
        )
    return found[0]
