"""Memory: slots with their limits, inner state read-only in chat, summaries, scratch notes, the chat tools."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.components import ToolContext, context_blocks, registry
from chat.models import Direction, LLMCall, Message, SourceKind
from core import config
from scheduling.life.error_codes import LifeError, MemoryErrorCode
from scheduling.life.memory import (
    inner_state_update,
    memory_slot_forget,
    memory_slot_set,
    on_inbound_stored,
    summary_refresh,
    summary_refresh_due,
)
from scheduling.life.models import InnerStateRevision, MemorySlot, SessionSummary, Timer, TimerStatus
from tests.fake_llm import FakeLLM

pytestmark = pytest.mark.django_db


def call(name, session, **args):
    return registry.get(name)(ToolContext(session=session, tool_call_id="call_1"), **args)


# --- memory slots ---------------------------------------------------------------------------------


def test_remember_and_forget_through_the_chat_tools(make_session):
    session = make_session()
    assert call("remember", session, key="生日", content="5月3日")["ok"]
    assert call("remember", session, key="生日", content="5月4日") == {
        "ok": True,
        "key": "生日",
        "content": "5月4日",
        "scope": "chat",
        "created": False,
    }
    assert call("remember", session, key="bot_name_rule", content="call me 麦麦", scope="global")["ok"]
    slot = MemorySlot.objects.get(session=session)
    assert (slot.key, slot.content, slot.updated_by_tool_call_id) == ("生日", "5月4日", "call_1")
    assert call("forget", session, key="生日")["ok"]
    missing = call("forget", session, key="生日")
    assert missing["error"]["code"] == "not_found"
    assert MemorySlot.objects.filter(session__isnull=True).count() == 1


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"key": "", "content": "x"}, MemoryErrorCode.INVALID_KEY),
        ({"key": "a\nb", "content": "x"}, MemoryErrorCode.INVALID_KEY),
        ({"key": "k" * 65, "content": "x"}, MemoryErrorCode.INVALID_KEY),
        ({"key": "k", "content": "  "}, MemoryErrorCode.EMPTY_CONTENT),
        ({"key": "k", "content": "x" * 301}, MemoryErrorCode.CONTENT_TOO_LONG),
        ({"key": "k", "content": "x", "scope": "everywhere"}, MemoryErrorCode.INVALID_SCOPE),
    ],
)
def test_bad_memory_writes_are_refused_with_a_code(make_session, args, code):
    result = call("remember", make_session(), **args)
    assert result["ok"] is False and result["error"]["code"] == code
    assert not MemorySlot.objects.exists()


def test_each_scope_holds_at_most_the_configured_number_of_slots(make_session):
    a, b = make_session(), make_session()
    with config.override(life={"memory_max_slots": 3}):
        for i in range(3):
            memory_slot_set(key=f"k{i}", content="x", session=a)
        with pytest.raises(LifeError) as exc:
            memory_slot_set(key="k3", content="x", session=a)
        assert exc.value.code == MemoryErrorCode.MEMORY_FULL and "3" in exc.value.message
        memory_slot_set(key="k0", content="overwrite is fine", session=a)
        memory_slot_set(key="k3", content="another chat has room", session=b)
        memory_slot_set(key="k3", content="global has room", session=None)
        memory_slot_forget(key="k1", session=a)
        memory_slot_set(key="k3", content="room again", session=a)
    assert MemorySlot.objects.filter(session=a).count() == 3


def test_the_default_limit_is_one_hundred(make_session):
    session = make_session()
    MemorySlot.objects.bulk_create(MemorySlot(session=session, key=f"k{i}", content="x") for i in range(100))
    assert call("remember", session, key="one more", content="x")["error"]["code"] == "memory_full"


# --- prompt blocks and the inner state ------------------------------------------------------------


def test_the_chat_planner_sees_inner_state_memory_summary_and_notes(make_session):
    session, other = make_session(), make_session()
    inner_state_update(text="最近在准备考试", via="system")
    memory_slot_set(key="称呼", content="叫他小明", session=session)
    memory_slot_set(key="secret", content="not for this chat", session=other)
    memory_slot_set(key="timezone", content="the owner lives in Berlin", session=None)
    SessionSummary.objects.create(session=session, text="聊了考试安排")
    call("note", session, text="step 1: ask which exam")
    blocks = dict(context_blocks(session))
    assert "最近在准备考试" in blocks["inner_state"]
    assert "称呼: 叫他小明" in blocks["memory"] and "timezone: the owner lives in Berlin" in blocks["memory"]
    assert "secret" not in blocks["memory"]
    assert "聊了考试安排" in blocks["summary"]
    assert "step 1: ask which exam" in blocks["scratch"]
    assert [name for name, _ in context_blocks(session)] == ["inner_state", "memory", "summary", "scratch"]
    assert call("clear_notes", session) == {"ok": True, "cleared": 1}
    assert "scratch" not in dict(context_blocks(session))


def test_the_chat_planner_has_no_tool_to_change_the_inner_state(make_session):
    names = {t.name for t in registry.available(ToolContext(session=make_session()))}
    assert {"remember", "forget", "note", "set_timer", "list_timers", "cancel_timer"} <= names
    assert not {n for n in names if "inner" in n or "state" in n}


def test_inner_state_changes_keep_their_history():
    inner_state_update(text="one", via="system")
    inner_state_update(text="two", via="life", tool_call_id="call_9")
    newest, oldest = InnerStateRevision.objects.all()
    assert (newest.text, newest.previous_text, newest.via, newest.tool_call_id) == ("two", "one", "life", "call_9")
    assert (oldest.text, oldest.previous_text) == ("one", "")
    with config.override(life={"inner_state_max_length": 5}), pytest.raises(LifeError) as exc:
        inner_state_update(text="too long", via="life")
    assert exc.value.code == MemoryErrorCode.TEXT_TOO_LONG
    assert InnerStateRevision.objects.count() == 2


# --- rolling summaries ----------------------------------------------------------------------------


def inbound(session, text):
    from django.utils import timezone

    return Message.objects.create(
        session=session,
        direction=Direction.IN,
        source_kind=SourceKind.USER,
        sender_id=session.user_id,
        sender_nickname=session.user_nickname,
        text=text,
        segments=[{"type": "text", "data": text}],
        time=timezone.now(),
    )


def test_a_summary_is_requested_once_after_enough_new_messages(make_session):
    session = make_session()
    with config.override(life={"summary_every_messages": 3}):
        inbound(session, "1")
        inbound(session, "2")
        assert summary_refresh_due([session.pk]) == []
        inbound(session, "3")
        assert summary_refresh_due([session.pk]) == [session.pk]
        assert summary_refresh_due([session.pk]) == []  # requested already; not again
    with config.override(life={"summary_every_messages": 0}):
        assert summary_refresh_due([session.pk]) == []


def test_the_summary_check_counts_no_further_than_it_needs(make_session):
    # A chat whose summaries never succeed keeps growing; the check must not scan all of it each time.
    session = make_session()
    for i in range(12):
        inbound(session, str(i))
    with config.override(life={"summary_every_messages": 5}), CaptureQueriesContext(connection) as queries:
        assert summary_refresh_due([session.pk]) == [session.pk]
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1 and "LIMIT 5" in counts[0], counts


def test_the_inbound_hook_requests_a_summary_when_a_chat_has_grown(make_session):
    session = make_session()
    messages = [inbound(session, str(i)) for i in range(3)]
    with config.override(life={"summary_every_messages": 3}):
        on_inbound_stored(sender=None, messages=messages)
    assert SessionSummary.objects.get(session=session).refresh_requested_at is not None


def test_a_summary_refresh_folds_new_messages_in_with_one_ledgered_call(make_session):
    session = make_session(user_nickname="小红")
    inbound(session, "我下周三考高数")
    SessionSummary.objects.create(session=session, text="之前聊过复习计划")
    with (
        FakeLLM() as fake,
        config.override(llm={"base_url": fake.base_url, "model": "fake-model", "max_retries": 0}),
    ):
        fake.script(fake.text("小红下周三考高数，之前聊过复习计划。"))
        assert summary_refresh(session.pk) == "refreshed"
        prompt = fake.requests[0]["messages"][1]["content"]
    assert "之前聊过复习计划" in prompt and "小红: 我下周三考高数" in prompt
    summary = SessionSummary.objects.get(session=session)
    assert summary.text == "小红下周三考高数，之前聊过复习计划。"
    assert summary.last_message_id == Message.objects.get().pk and summary.refreshed_at
    assert LLMCall.objects.get().purpose == "summary"


# --- timer tools ----------------------------------------------------------------------------------


def test_the_timer_tools_are_bound_to_the_current_chat(make_session):
    session, other = make_session(), make_session(chat_type="group")
    made = call("set_timer", session, spec="30分钟", label="问问复习进度", payload="他在准备考试")
    assert made["ok"] and made["session_id"] == session.session_id and made["timer_id"].startswith("tm_")
    assert made["next_fire"].endswith("+08:00")  # shown in the bot's time zone
    assert call("set_timer", other, spec="cron:0 20 * * *", label="group evening")["ok"]
    listed = call("list_timers", session)
    assert [t["label"] for t in listed["timers"]] == ["问问复习进度"]
    assert call("cancel_timer", other, timer_id=made["timer_id"])["error"]["code"] == "not_found"
    assert call("cancel_timer", session, timer_id=made["timer_id"]) == {
        "ok": True,
        "session_id": session.session_id,
        "cancelled_timer_id": made["timer_id"],
    }
    assert Timer.objects.get(pk=made["timer_id"]).status == TimerStatus.CANCELLED
    assert call("cancel_timer", session, timer_id=made["timer_id"])["error"]["code"] == "not_active"
    assert call("list_timers", session)["timers"] == []


def test_set_timer_explains_a_bad_spec(make_session):
    result = call("set_timer", make_session(), spec="tomorrow morning", label="x")
    assert result["ok"] is False and result["error"]["code"] == "invalid_spec"
    assert "not a duration" in result["error"]["message"]
    assert not Timer.objects.exists()
