"""The one time parser: absolute instants (ISO 8601) and timer specs (`30s`, `once:…`, `cron:…`)."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo


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
