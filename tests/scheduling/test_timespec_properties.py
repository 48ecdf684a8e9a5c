"""Property-based pass over the one time parser: whatever text comes in, it answers with a time or a
TimeSpecError saying what is wrong — never an OverflowError, KeyError or any other crash."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduling.timespec import TimeSpecError, parse_instant, parse_timer_spec, split_spoken_time

TZ = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 6, 15, 3, 30, tzinfo=UTC)

ZH_NUMERALS = "零一二两三四五六七八九十百半"
PIECES = st.sampled_from(
    [
        "in ",
        "at ",
        "remind me ",
        "every:",
        "once:",
        "cron:",
        "每",
        "后",
        "以后",
        "之后",
        "提醒我",
        "明天",
        "后天",
        "早上",
        "下午",
        "今晚",
        "点",
        "分",
        "半",
        ":",
        "：",
        "-",
        "T",
        "Z",
        "+",
        "+05:00",
        "-05:00",
        " ",
        "s",
        "min",
        "h",
        "d",
        "days",
        "hours",
        "minutes",
        "秒",
        "分钟",
        "小时",
        "天",
        "am",
        "pm",
        "9999",
        "0001",
        "99999999999",
        "12-31",
        "23:59",
        "00:00",
        "*",
        "/",
        "half an hour",
    ]
)
TEXTS = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(PIECES, st.integers(0, 10**15).map(str), st.sampled_from(list(ZH_NUMERALS))), max_size=8).map(
        "".join
    ),
)


def _only_our_refusal(call):
    try:
        return call()
    except TimeSpecError:
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
@example("9999-12-31T23:59:59-05:00")
@example("0001-01-01 00:00:00+05:00")
@example("9999-12-31 23:59:59")
def test_parse_instant_answers_a_utc_instant_or_refuses(text):
    when = _only_our_refusal(lambda: parse_instant(text, TZ))
    assert when is None or when.tzinfo is UTC


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
@example("99999999999d")
@example("once:9999-12-31T23:59-05:00")
@example("every:99999999999999999999s")
@example("每十十分钟")
def test_timer_specs_parse_and_preview_or_refuse(text):
    spec = _only_our_refusal(lambda: parse_timer_spec(text, TZ))
    if spec is not None:
        upcoming = _only_our_refusal(lambda: spec.upcoming(NOW, TZ, count=3))
        assert upcoming is None or all(w.tzinfo is not None for w in upcoming)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS)
@example("十十分钟后 喝水")
@example("99999999999天后喝水")
@example("in 99999999999 days x")
@example("9999-12-31T23:59:59-05:00 x")
def test_spoken_times_are_read_or_refused(text):
    found = _only_our_refusal(lambda: split_spoken_time(text, TZ, now=NOW))
    assert found is None or (found[0].tzinfo is not None and isinstance(found[1], str))


def test_the_findings_are_refusals_that_say_why():
    for text, words in [
        ("十十分钟后 喝水", "not a number"),
        ("99999999999天后喝水", "years away"),
        ("in 99999999999 days x", "years away"),
        ("9999-12-31T23:59:59-05:00 x", "out of range"),
    ]:
        try:
            split_spoken_time(text, TZ, now=NOW)
        except TimeSpecError as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"{text!r} was accepted")
    for spec, words in [("99999999999d", "longer than"), ("once:9999-12-31T23:59-05:00", "out of range")]:
        try:
            parse_timer_spec(spec, TZ)
        except TimeSpecError as exc:
            assert words in str(exc)
        else:
            raise AssertionError(f"{spec!r} was accepted")
