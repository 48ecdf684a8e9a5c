"""Query counts of the planner's hot path "prepare": opening a cycle and rendering its prompt for a
session with a 100-message history and every registered context block saying something."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.models import Direction, Message, SourceKind
from chat.planner import HistoryCache
from chat.planner.cycle import cycle_open
from core import config
from scheduling.life.memory import inner_state_update, memory_slot_set, scratch_note_add
from scheduling.life.models import SessionSummary

pytestmark = pytest.mark.django_db

# Open the cycle (1 INSERT); read the history (1) and the last cycle records (1) when the runtime's
# cache is cold, or the rows stored since the last cycle (1) when it is warm; the tools on offer
# (1: are there stickers?); the context blocks: inner state (1), memory slots (1), summary (1),
# scratch notes (1).
COLD_QUERIES = 8
WARM_QUERIES = 7


@pytest.fixture
def busy_session(make_session):
    session = make_session(user_nickname="Alice")
    now = timezone.now()
    Message.objects.bulk_create(
        Message(
            session=session,
            direction=Direction.IN,
            source_kind=SourceKind.USER,
            platform_message_id=str(10_000 + i),
            sender_id="1",
            sender_nickname="Alice",
            text=f"message {i}: 今天天气不错 shall we?",
            time=now,
        )
        for i in range(100)
    )
    inner_state_update(text="在准备考试", via="system")
    memory_slot_set(key="称呼", content="Alice", session=session)
    memory_slot_set(key="city", content="Berlin", session=None)
    SessionSummary.objects.create(session=session, text="聊了考试")
    scratch_note_add(session=session, text="ask about the exam")
    return session


def open_cycle(session, cache, new):
    _turn, prepared = cycle_open(
        session=session,
        trigger="1 new message(s)",
        started_at=timezone.now(),
        new_messages=new,
        mentioned=False,
        history_cache=cache,
    )
    assert not isinstance(prepared, Exception), prepared
    return prepared


def test_prepare_reads_a_bounded_number_of_queries(busy_session):
    cache = HistoryCache()
    with config.override(chat={"history_window": 100}):
        new = [Message.objects.filter(session=busy_session).latest("id")]
        with CaptureQueriesContext(connection) as cold:
            prepared = open_cycle(busy_session, cache, new)
        user = prepared.messages[1]["content"]
        assert "message 99" in user and "在准备考试" in user and "称呼: Alice" in user
        assert "聊了考试" in user and "ask about the exam" in user
        new = Message.objects.create(
            session=busy_session,
            direction=Direction.IN,
            source_kind=SourceKind.USER,
            text="one more",
            time=timezone.now(),
        )
        with CaptureQueriesContext(connection) as warm:
            prepared = open_cycle(busy_session, cache, [new])
        assert "one more" in prepared.messages[1]["content"]
    assert len(cold) == COLD_QUERIES, [q["sql"] for q in cold.captured_queries]
    assert len(warm) == WARM_QUERIES, [q["sql"] for q in warm.captured_queries]
