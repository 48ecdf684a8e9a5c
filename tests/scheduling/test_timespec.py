"""Timer specs: delays (English and Chinese units), every:, once:, cron: in the bot's zone, across DST."""

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling.timespec import TimerKind, TimeSpecError, cron_next, parse_duration, parse_timer_spec

SH = ZoneInfo("Asia/Shanghai")
NY = ZoneInfo("America/New_York")
NOW = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5min", 300),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30min", 5400),
        ("1h 30min", 5400),
        ("90 minutes", 5400),
        ("30秒", 30),
        ("5分钟", 300),
        ("2小时", 7200),
        ("1天", 86400),
        ("1小时30分钟", 5400),
        ("2个小时", 7200),
        ("5MIN", 300),
    ],
)
def test_delays_in_english_and_chinese_units_fire_once_that_long_after(text, seconds):
    spec = parse_timer_spec(text, SH)
    assert spec.kind == TimerKind.AFTER and not spec.repeats
    assert spec.first_fire(NOW, SH) == NOW + timedelta(seconds=seconds)
    assert spec.next_fire(spec.first_fire(NOW, SH), NOW, SH) is None


@pytest.mark.parametrize("text", ["every:10min", "每10分钟", "EVERY: 10 min"])
def test_every_repeats_at_its_interval(text):
    spec = parse_timer_spec(text, SH)
    assert spec.kind == TimerKind.EVERY and spec.repeats
    first = spec.first_fire(NOW, SH)
    assert first == NOW + timedelta(minutes=10)
    assert spec.next_fire(first, first + timedelta(seconds=0.3), SH) == first + timedelta(minutes=10)


def test_every_after_downtime_fires_once_and_moves_to_the_next_future_slot():
    spec = parse_timer_spec("every:10min", SH)
    due = NOW
    now = NOW + timedelta(minutes=35)  # three and a half periods missed
    nxt = spec.next_fire(due, now, SH)
    assert nxt == NOW + timedelta(minutes=40)
    assert nxt > now


def test_once_is_read_in_the_bots_time_zone_or_its_own_offset():
    local = parse_timer_spec("once:2026-04-10 09:00", SH)
    assert local.kind == TimerKind.ONCE
    assert local.first_fire(NOW, SH) == datetime(2026, 4, 10, 1, 0, tzinfo=UTC)
    assert local.next_fire(local.at, local.at, SH) is None
    with_offset = parse_timer_spec("once:2026-04-10T09:00:00-04:00", SH)
    assert with_offset.at == datetime(2026, 4, 10, 13, 0, tzinfo=UTC)
    assert parse_timer_spec("once:2026-04-10T09:00Z", SH).at == datetime(2026, 4, 10, 9, 0, tzinfo=UTC)
    # A full-width colon, as a Chinese keyboard types it.
    assert parse_timer_spec("once：2026-04-10 09:00", SH).at == local.at


def test_cron_runs_in_local_wall_time():
    spec = parse_timer_spec("cron:0 8 * * *", SH)
    assert spec.kind == TimerKind.CRON and spec.repeats
    first = spec.first_fire(NOW, SH)  # 20:00 in Shanghai → tomorrow 08:00 local
    assert first == datetime(2026, 4, 2, 0, 0, tzinfo=UTC)
    assert first.astimezone(SH).hour == 8
    assert spec.next_fire(first, first + timedelta(seconds=0.2), SH) == first + timedelta(days=1)


def test_cron_after_downtime_fires_once_then_moves_to_the_next_future_time():
    spec = parse_timer_spec("cron:*/5 * * * *", SH)
    due = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)
    now = due + timedelta(minutes=23, seconds=10)
    assert spec.next_fire(due, now, SH) == datetime(2026, 4, 1, 12, 25, tzinfo=UTC)


def test_cron_keeps_its_wall_time_across_dst_changes():
    spec = parse_timer_spec("cron:0 8 * * *", NY)
    before = cron_next(spec.cron, datetime(2026, 3, 7, 0, 0, tzinfo=UTC), NY)
    after = cron_next(spec.cron, before, NY)
    assert before.astimezone(NY).hour == after.astimezone(NY).hour == 8
    assert after - before == timedelta(hours=23)  # the spring-forward day is 23 hours long
    fall1 = cron_next(spec.cron, datetime(2026, 10, 31, 0, 0, tzinfo=UTC), NY)
    fall2 = cron_next(spec.cron, fall1, NY)
    assert fall2 - fall1 == timedelta(hours=25)
    assert fall2.astimezone(NY).hour == 8


def test_spring_forward_a_skipped_wall_time_fires_once_right_after_the_gap():
    # 2026-03-08: New York clocks jump from 02:00 EST to 03:00 EDT.
    daily = cron_next("30 2 * * *", datetime(2026, 3, 7, 12, 0, tzinfo=UTC), NY)
    assert daily == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 03:00 EDT, the first instant after the gap
    assert cron_next("30 2 * * *", daily, NY).astimezone(NY).isoformat() == "2026-03-09T02:30:00-04:00"
    fires, t = [], datetime(2026, 3, 8, 6, 30, tzinfo=UTC)  # 01:30 EST
    for _ in range(4):
        t = cron_next("*/20 * * * *", t, NY)
        fires.append(t.astimezone(NY).strftime("%H:%M%z"))
    # 02:00, 02:20, 02:40 do not exist: one fire at 03:00 covers them, no duplicates.
    assert fires == ["01:40-0500", "03:00-0400", "03:20-0400", "03:40-0400"]


def test_fall_back_a_repeated_wall_time_fires_once_but_wildcard_hours_keep_real_time():
    # 2026-11-01: New York clocks go back from 02:00 EDT to 01:00 EST; 01:00-01:59 happens twice.
    daily = cron_next("30 1 * * *", datetime(2026, 10, 31, 12, 0, tzinfo=UTC), NY)
    assert daily.astimezone(NY).isoformat() == "2026-11-01T01:30:00-04:00"
    assert cron_next("30 1 * * *", daily, NY).astimezone(NY).isoformat() == "2026-11-02T01:30:00-05:00"
    fires, t = [], datetime(2026, 11, 1, 4, 50, tzinfo=UTC)  # 00:50 EDT
    for _ in range(6):
        t = cron_next("*/30 * * * *", t, NY)
        fires.append(t)
    assert all(b - a == timedelta(minutes=30) for a, b in itertools.pairwise(fires))
    assert [f.astimezone(NY).strftime("%H:%M%z") for f in fires] == [
        "01:00-0400",
        "01:30-0400",
        "01:00-0500",
        "01:30-0500",
        "02:00-0500",
        "02:30-0500",
    ]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "no timer spec"),
        ("   ", "no timer spec"),
        ("soon", "not a duration"),
        ("5 fortnights", "unknown unit 'fortnights'"),
        ("0s", "zero"),
        ("1.5h", "cannot read"),
        ("5min later", "not a duration"),
        ("every:", "no duration"),
        ("daily:08:00", "unknown spec kind 'daily'"),
        ("once:tomorrow", "not an ISO 8601"),
        ("once:2026-04-10", "no time of day"),
        ("once:2026-13-01 09:00", "not an ISO 8601"),
        ("cron:0 8 * *", "has 4 fields; expected 5"),
        ("cron:0 0 8 * * *", "has 6 fields"),
        ("cron:61 * * * *", "not a valid cron"),
        ("cron:0 0 31 2 *", "never matches"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, complaint):
    with pytest.raises(TimeSpecError) as exc:
        parse_timer_spec(text, SH)
    assert complaint in str(exc.value)


def test_once_inside_a_dst_gap_is_refused():
    with pytest.raises(TimeSpecError, match="does not exist"):
        parse_timer_spec("once:2026-03-08 02:30", NY)


def test_parse_duration_rejects_non_text():
    with pytest.raises(TimeSpecError):
        parse_duration("")


def test_upcoming_lists_the_next_fires_of_a_cron():
    spec = parse_timer_spec("cron:0 9 * * 1-5", SH)
    fires = spec.upcoming(NOW, SH, count=5)
    assert len(fires) == 5
    assert all(f.astimezone(SH).hour == 9 and f.astimezone(SH).weekday() < 5 for f in fires)
    assert fires == sorted(fires)
