"""The offline planner (no model configured): reminders in English and Chinese, /schedule /list
/cancel, the fixed answer in the bot's language, and the spoken times it relies on."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone

from chat.models import Direction, LLMCall, Message, PlannerCycle, ToolCallRecord
from chat.offline import run_offline_cycle
from core import config
from core.config import format_instant
from scheduling.dispatcher import deliver_due
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.timespec import TimeSpecError, parse_spoken_time, split_spoken_time
from tests.chat.planner_helpers import inbound_store, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async

SHANGHAI = ZoneInfo("Asia/Shanghai")
NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)  # 09:00 in Shanghai


@pytest.mark.parametrize(
    ("text", "expected", "rest"),
    [
        ("in 10 minutes to drink water", "2026-11-22T09:10:00+08:00", "to drink water"),
        ("in 1 hour 30 minutes", "2026-11-22T10:30:00+08:00", ""),
        ("in half an hour stretch", "2026-11-22T09:30:00+08:00", "stretch"),
        ("at 8:30 to call mom", "2026-11-23T08:30:00+08:00", "to call mom"),  # passed today → tomorrow
        ("at 8:30pm", "2026-11-22T20:30:00+08:00", ""),
        ("tomorrow at 7 run", "2026-11-23T07:00:00+08:00", "run"),
        ("10分钟后喝水", "2026-11-22T09:10:00+08:00", "喝水"),
        ("三分钟以后", "2026-11-22T09:03:00+08:00", ""),
        ("半小时后", "2026-11-22T09:30:00+08:00", ""),
        ("明天早上8点开会", "2026-11-23T08:00:00+08:00", "开会"),
        ("下午3点半", "2026-11-22T15:30:00+08:00", ""),
        ("晚上九点十五分", "2026-11-22T21:15:00+08:00", ""),
        ("2026-11-23T08:00:00+08:00 hi", "2026-11-23T08:00:00+08:00", "hi"),
    ],
)
def test_spoken_times(text, expected, rest):
    when, leftover = split_spoken_time(text, SHANGHAI, now=NOW)
    assert (format_instant(when, SHANGHAI), leftover) == (expected, rest)


@pytest.mark.parametrize("text", ["hello", "8 apples", "在吗"])
def test_texts_without_a_time(text):
    assert split_spoken_time(text, SHANGHAI, now=NOW) is None
    with pytest.raises(TimeSpecError):
        parse_spoken_time(text, SHANGHAI, now=NOW)


def test_today_with_a_past_time_is_an_error():
    with pytest.raises(TimeSpecError, match="already passed"):
        parse_spoken_time("今天早上8点", SHANGHAI, now=NOW)


def turn(session, *texts):
    messages = [inbound_store(session=session, text=t) for t in texts]
    return async_to_sync(run_offline_cycle)(session=session, new_messages=messages, mentioned=False)


def replies(session) -> list[str]:
    return list(Message.objects.filter(session=session, direction=Direction.OUT).values_list("text", flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "text", "minutes", "what"),
    [
        ("en", "remind me in 10 minutes to drink water", 10, "drink water"),
        ("en", "Remind me to stretch in 5 minutes", 5, "stretch"),
        ("zh", "提醒我10分钟后喝水", 10, "喝水"),
        ("zh", "10分钟后提醒我喝水", 10, "喝水"),
        ("zh", "二十分钟后提醒我去开会", 20, "开会"),
    ],
)
def test_relative_reminders_are_scheduled_and_confirmed(make_session, language, text, minutes, what):
    session = make_session()
    with config.override(bot={"language": language}):
        before = timezone.now()
        cycle = turn(session, text)
    task = ScheduledMessage.objects.get(session=session)
    expected = before + timedelta(minutes=minutes)
    assert abs((task.send_at - expected).total_seconds()) < 5
    assert task.message_text == f"⏰ {what}" and task.status == ScheduledStatus.PENDING
    [record] = ToolCallRecord.objects.filter(cycle=cycle)
    assert task.created_by_tool_call_id == record.tool_call_id and record.name == "schedule_private_message"
    [confirmation] = replies(session)
    assert what in confirmation and task.pk in confirmation
    assert confirmation.startswith("好的" if language == "zh" else "OK")
    assert cycle.action == "offline_schedule" and not LLMCall.objects.exists()


@pytest.mark.django_db
def test_tomorrow_morning_in_chinese_and_clock_time_in_english(make_session):
    session = make_session()
    tz = config.get_config().tzinfo
    turn(session, "明天早上8点提醒我开会", "remind me at 8:30 to call mom")
    first, second = ScheduledMessage.objects.filter(session=session).order_by("created_at")
    tomorrow = (timezone.now().astimezone(tz) + timedelta(days=1)).date()
    assert first.send_at.astimezone(tz).replace(tzinfo=None) == datetime(
        tomorrow.year, tomorrow.month, tomorrow.day, 8, 0
    )
    local = second.send_at.astimezone(tz)
    assert (local.hour, local.minute) == (8, 30) and second.send_at > timezone.now()
    assert second.message_text == "⏰ call mom"
    assert len(replies(session)) == 2


@pytest.mark.django_db
def test_schedule_list_and_cancel_commands(make_session):
    session = make_session()
    with config.override(bot={"language": "en"}):
        turn(session, "/schedule in 2 hours stand up")
        task = ScheduledMessage.objects.get(session=session)
        assert task.message_text == "⏰ stand up"
        listing = turn(session, "/list")
        assert listing.action == "offline_list" and task.pk in replies(session)[-1]
        cancel = turn(session, f"/cancel {task.pk}")
        assert cancel.action == "offline_cancel"
        task.refresh_from_db()
        assert task.status == ScheduledStatus.CANCELLED and task.cancelled_via == "tool"
        turn(session, "/list")
        assert replies(session)[-1] == "No pending reminders."
        bad = turn(session, "/cancel sm_nope")
        assert bad.action == "offline_error" and "no scheduled message" in replies(session)[-1]
        turn(session, "/schedule yesterday at noon do it")
        assert replies(session)[-1].startswith("I could not read the time")
        assert ScheduledMessage.objects.filter(session=session).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("language", "needle"), [("zh", "离线模式"), ("en", "Offline mode: no model is configured")])
def test_anything_else_gets_the_offline_answer_in_the_bot_language(make_session, language, needle):
    session = make_session()
    with config.override(bot={"language": language}):
        cycle = turn(session, "what's the weather like?")
    [answer] = replies(session)
    assert needle in answer and cycle.action == "offline_notice"
    assert not ScheduledMessage.objects.exists()


@pytest.mark.django_db
def test_messages_without_text_get_no_offline_answer(make_session):
    session = make_session()
    image = inbound_store(session=session, text="[image]")
    image.segments = [{"type": "image", "data": {"media": "ab12"}}]
    assert async_to_sync(run_offline_cycle)(session=session, new_messages=[image], mentioned=False) is None
    assert replies(session) == [] and not PlannerCycle.objects.exists()


@pytest.mark.django_db
def test_group_chatter_is_ignored_offline(make_session):
    group = make_session(chat_type="group")
    assert turn(group, "lunch?") is None and replies(group) == []
    mentioned = async_to_sync(run_offline_cycle)(
        session=group, new_messages=[inbound_store(session=group, text="麦麦 在吗")], mentioned=True
    )
    assert mentioned.action == "offline_notice" and len(replies(group)) == 1


@pytest.mark.django_db(transaction=True)
async def test_offline_runtime_schedules_and_the_dispatcher_delivers(runtimes, make_session):
    assert config.get_config().offline
    session = await sync_to_async(make_session)()
    with config.override(chat={"debounce_seconds": 0.1}, bot={"language": "en"}):
        await say(session, "/schedule in 2 seconds 喝水 drink water")

        async def scheduled():
            return await ScheduledMessage.objects.filter(session=session).aexists()

        await wait_for_async(scheduled, what="the offline planner to schedule")
        task = await ScheduledMessage.objects.aget(session=session)

        async def delivered():
            await sync_to_async(deliver_due)()
            return await ScheduledMessage.objects.filter(pk=task.pk, status=ScheduledStatus.SENT).aexists()

        await wait_for_async(delivered, timeout=30, what="delivery")
    texts = [m.text async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]
    assert texts[0].startswith("OK, I'll remind you") and texts[-1] == "⏰ 喝水 drink water"
    cycle = await PlannerCycle.objects.aget(session=session)
    assert cycle.action == "offline_schedule" and not await LLMCall.objects.aexists()
