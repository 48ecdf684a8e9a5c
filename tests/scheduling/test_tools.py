"""The three scheduling tools, called as the planner calls them: with a ToolContext."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.components import ToolContext, registry
from core import config
from scheduling.models import Actor, ScheduledMessage, ScheduledStatus

pytestmark = pytest.mark.django_db


def call(name, session, tool_call_id="call_1", **args):
    return registry.get(name)(ToolContext(session=session, tool_call_id=tool_call_id), **args)


def iso_in(**delta) -> str:
    return (timezone.now() + timedelta(**delta)).isoformat()


def test_schedule_returns_task_and_stores_it_with_the_tool_call_id(make_session):
    session = make_session()
    result = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="drink water 喝水")
    assert result["ok"] is True
    task = ScheduledMessage.objects.get(pk=result["task_id"])
    assert result["session_id"] == session.session_id
    assert result["message_text"] == "drink water 喝水"
    assert result["replace_existing"] is False
    assert "cancelled_task_ids" not in result
    assert task.status == ScheduledStatus.PENDING
    assert task.created_by_tool_call_id == "call_1"
    assert task.created_via == Actor.TOOL
    # Returned normalized with the bot's offset (Asia/Shanghai by default).
    assert result["send_at"].endswith("+08:00")


def test_send_at_without_offset_is_read_in_the_bot_time_zone(make_session):
    session = make_session()
    with config.override(bot={"time_zone": "Europe/Berlin"}):
        local = (timezone.now() + timedelta(days=2)).astimezone(config.get_config().tzinfo)
        naive = local.replace(tzinfo=None, microsecond=0).isoformat()
        result = call("schedule_private_message", session, send_at=naive, message_text="hi")
    task = ScheduledMessage.objects.get(pk=result["task_id"])
    assert task.send_at == local.replace(microsecond=0)
    assert task.send_at.utcoffset() == timedelta(0)  # stored in UTC


def test_send_at_with_offset_means_that_instant(make_session):
    session = make_session()
    when = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    result = call("schedule_private_message", session, send_at=when.astimezone().isoformat(), message_text="x")
    assert ScheduledMessage.objects.get(pk=result["task_id"]).send_at == when


@pytest.mark.parametrize(
    ("send_at", "text", "code"),
    [
        ("tomorrow at 8", "x", "invalid_time"),
        ("2026-13-01T08:00", "x", "invalid_time"),
        ("2020-01-01T08:00:00+00:00", "x", "invalid_time"),
        ("2020-01-01", "x", "invalid_time"),
        ("PLUS_400_DAYS", "x", "invalid_time"),
        ("PLUS_1_HOUR", "   ", "empty_text"),
        ("PLUS_1_HOUR", "长" * 1025, "text_too_long"),
    ],
)
def test_bad_requests_fail_with_a_code_and_store_nothing(make_session, send_at, text, code):
    session = make_session()
    send_at = {"PLUS_400_DAYS": iso_in(days=400), "PLUS_1_HOUR": iso_in(hours=1)}.get(send_at, send_at)
    result = call("schedule_private_message", session, send_at=send_at, message_text=text)
    assert result["ok"] is False
    assert result["error"]["code"] == code
    assert result["error"]["message"]
    assert not ScheduledMessage.objects.exists()


def test_group_chat_is_refused_by_every_tool(make_session):
    group = make_session("group")
    for name, args in [
        ("schedule_private_message", {"send_at": iso_in(hours=1), "message_text": "x"}),
        ("cancel_scheduled_private_message", {}),
        ("list_scheduled_private_messages", {}),
    ]:
        assert call(name, group, **args)["error"]["code"] == "not_private_chat"
    assert not ScheduledMessage.objects.exists()


def test_text_limit_and_pending_cap_are_configurable(make_session):
    session = make_session()
    with config.override(scheduling={"max_text_length": 5, "max_pending_per_session": 2}):
        assert (
            call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="123456")["error"]["code"]
            == "text_too_long"
        )
        for _ in range(2):
            assert call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="ok")["ok"]
        third = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="ok")
    assert third["error"]["code"] == "too_many_pending"
    assert ScheduledMessage.objects.count() == 2


def test_replace_existing_cancels_all_pending_of_that_session_only(make_session):
    session, other = make_session(), make_session()
    first = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="a")
    second = call("schedule_private_message", session, send_at=iso_in(hours=2), message_text="b")
    theirs = call("schedule_private_message", other, send_at=iso_in(hours=1), message_text="c")
    result = call(
        "schedule_private_message",
        session,
        tool_call_id="call_9",
        send_at=iso_in(hours=3),
        message_text="d",
        replace_existing=True,
    )
    assert result["ok"] and result["replace_existing"] is True
    assert sorted(result["cancelled_task_ids"]) == sorted([first["task_id"], second["task_id"]])
    cancelled = ScheduledMessage.objects.get(pk=first["task_id"])
    assert cancelled.status == ScheduledStatus.CANCELLED
    assert cancelled.cancelled_by_tool_call_id == "call_9"
    assert ScheduledMessage.objects.get(pk=theirs["task_id"]).status == ScheduledStatus.PENDING


def test_replace_existing_is_atomic_when_the_new_task_is_refused(make_session):
    session = make_session()
    first = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="a")
    result = call("schedule_private_message", session, send_at="yesterday", message_text="d", replace_existing=True)
    assert result["error"]["code"] == "invalid_time"
    assert ScheduledMessage.objects.get(pk=first["task_id"]).status == ScheduledStatus.PENDING


def test_list_and_cancel(make_session):
    session = make_session()
    a = call("schedule_private_message", session, send_at=iso_in(hours=2), message_text="later")
    b = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="sooner")
    listed = call("list_scheduled_private_messages", session)
    assert [t["task_id"] for t in listed["tasks"]] == [b["task_id"], a["task_id"]]

    one = call("cancel_scheduled_private_message", session, tool_call_id="call_c", task_id=a["task_id"])
    assert one == {"ok": True, "session_id": session.session_id, "cancelled_task_ids": [a["task_id"]]}
    again = call("cancel_scheduled_private_message", session, task_id=a["task_id"])
    assert again["error"]["code"] == "not_pending"
    assert call("cancel_scheduled_private_message", session, task_id="sm_nope")["error"]["code"] == "not_found"

    rest = call("cancel_scheduled_private_message", session)
    assert rest["cancelled_task_ids"] == [b["task_id"]]
    assert call("list_scheduled_private_messages", session)["tasks"] == []


def test_cancel_cannot_reach_another_sessions_task(make_session):
    mine, theirs = make_session(), make_session()
    t = call("schedule_private_message", theirs, send_at=iso_in(hours=1), message_text="x")
    assert call("cancel_scheduled_private_message", mine, task_id=t["task_id"])["error"]["code"] == "not_found"
    assert ScheduledMessage.objects.get(pk=t["task_id"]).status == ScheduledStatus.PENDING


def test_nonexistent_local_time_in_a_dst_gap_is_invalid(make_session):
    session = make_session()
    with config.override(bot={"time_zone": "Europe/Berlin"}):
        year = timezone.now().year + 1
        result = call(
            "schedule_private_message", session, send_at=f"{year}-03-{_last_sunday(year, 3)}T02:30", message_text="x"
        )
    assert result["error"]["code"] == "invalid_time"
    assert "does not exist" in result["error"]["message"]


def _last_sunday(year: int, month: int) -> int:
    import calendar

    return max(week[calendar.SUNDAY] for week in calendar.monthcalendar(year, month))


def test_a_database_failure_is_reported_as_storage_error(make_session, monkeypatch):
    from django.db import DatabaseError

    session = make_session()

    def fail(*args, **kwargs):  # fault injection: the database refuses the write
        raise DatabaseError("disk I/O error")

    monkeypatch.setattr(ScheduledMessage, "save", fail)
    result = call("schedule_private_message", session, send_at=iso_in(hours=1), message_text="x")
    assert result["error"]["code"] == "storage_error"
    assert "disk I/O error" in result["error"]["message"]
