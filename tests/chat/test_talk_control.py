"""Talk control: talk_frequency per chat and time of day (quiet hours), ignore lists (stored, never
planned) and commands only for the listed operators; through the live runtime, the real openai client
and the scripted server, with an injected clock."""

from datetime import datetime

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chat import talk
from chat.models import Direction, Message
from chat.offline import run_offline_cycle
from core import config
from scheduling.models import ScheduledMessage
from tests.chat.planner_helpers import (  # noqa: F401
    fake_llm_fixture,
    inbound_store,
    runtimes_fixture,
    say,
    settled,
)

pytestmark = pytest.mark.django_db(transaction=True)

QUIET = {"start": "00:00", "end": "08:00", "talk_frequency": 0.0}


@pytest.fixture
def at(monkeypatch):
    """talk.clock, injected: set the local hour with at(hour)."""
    tz = config.get_config().tzinfo

    def set_hour(hour: int, minute: int = 0) -> None:
        moment = datetime.now(tz).replace(hour=hour, minute=minute, second=0, microsecond=0)
        monkeypatch.setattr(talk, "clock", lambda: moment)

    set_hour(12)
    return set_hour


def test_a_rule_for_the_chat_beats_one_for_every_chat_and_windows_may_cross_midnight(make_session, at):
    group, other = make_session("group"), make_session("group")
    rules = [
        {"start": "22:00", "end": "06:00", "talk_frequency": 0.0},
        {"chat": talk.chat_key(group), "start": "12:00", "end": "14:00", "talk_frequency": 1.0},
        {"chat": talk.chat_key(group), "talk_frequency": 0.25},  # all day
    ]
    with config.override(chat={"talk_frequency": 0.5, "talk_frequency_rules": rules}):
        expected = {(group, 12): 1.0, (group, 15): 0.25, (group, 23): 0.25, (other, 23): 0.0, (other, 5): 0.0}
        expected |= {(other, 6): 0.5, (other, 12): 0.5}
        for (session, hour), value in expected.items():
            at(hour)
            assert talk.talk_frequency(session) == value, (str(session), hour)
    assert talk.chat_key(group) == f"qq:group:{group.group_id}"


def test_a_bad_rule_is_refused_naming_the_key():
    with pytest.raises(config.ConfigError, match=r"chat.talk_frequency_rules.0.end"):
        config.parse_config('[[chat.talk_frequency_rules]]\nend = "24:00"\ntalk_frequency = 0\n')
    with pytest.raises(config.ConfigError, match=r"chat.talk_frequency_rules.0.talk_frequency"):
        config.parse_config("[[chat.talk_frequency_rules]]\ntalk_frequency = 2\n")


async def group_session(make_session):
    return await sync_to_async(make_session)("group")


async def test_quiet_hours_answer_only_when_addressed(fake_llm, runtimes, make_session, at):
    group = await group_session(make_session)
    with config.override(chat={"talk_frequency": 1.0, "talk_frequency_rules": [QUIET]}):
        at(3)
        await say(group, "anyone awake?", sender_id="u1")
        await settled(runtimes, group)
        assert fake_llm.requests == []
        fake_llm.script(fake_llm.tool_call("reply", {"text": "我在"}))
        await say(group, "麦麦 are you awake?", sender_id="u1")
        await settled(runtimes, group)
        assert len(fake_llm.requests) == 1
        at(9)  # the quiet hours are over: talk_frequency 1 plans every message again
        fake_llm.script(fake_llm.tool_call("no_reply", {"reason": "nothing to add"}))
        await say(group, "good morning all", sender_id="u1")
        await settled(runtimes, group)
        assert len(fake_llm.requests) == 2


async def test_ignored_people_and_chats_are_stored_but_never_planned(fake_llm, runtimes, make_session, at):
    group, ignored_group = await group_session(make_session), await group_session(make_session)
    ignore = {"ignored_users": ["qq:bot-2"], "ignored_chats": [talk.chat_key(ignored_group)]}
    with config.override(chat={"talk_frequency": 1.0, **ignore}):
        await say(group, "麦麦 I am another bot", sender_id="bot-2")
        await say(ignored_group, "麦麦 hello?", sender_id="u1")
        await settled(runtimes, group)
        await settled(runtimes, ignored_group)
        assert fake_llm.requests == []
        fake_llm.script(fake_llm.tool_call("reply", {"text": "hi"}))
        await say(group, "麦麦 hello", sender_id="u1")
        await settled(runtimes, group)
    assert len(fake_llm.requests) == 1
    stored = [m.text async for m in Message.objects.filter(direction=Direction.IN).order_by("id")]
    assert stored == ["麦麦 I am another bot", "麦麦 hello?", "麦麦 hello"]


async def test_with_a_model_commands_of_non_operators_are_never_planned(fake_llm, runtimes, make_session):
    private = await sync_to_async(make_session)()
    with config.override(chat={"command_operators": ["qq:admin-1"]}):
        await say(private, "/cancel sm_123")
        await settled(runtimes, private)
        assert fake_llm.requests == []
        fake_llm.script(fake_llm.tool_call("reply", {"text": "sure"}))
        await say(private, "what can you do?")
        await settled(runtimes, private)
    assert len(fake_llm.requests) == 1


def test_offline_commands_only_for_the_listed_operators(make_session):
    session = make_session(user_id="admin-1")
    stranger = make_session(user_id="stranger")
    with config.override(bot={"language": "en"}, chat={"command_operators": ["qq:admin-1"]}):
        mine = async_to_sync(run_offline_cycle)(
            session=session, new_messages=[inbound_store(session=session, text="/list")], mentioned=False
        )
        theirs = async_to_sync(run_offline_cycle)(
            session=stranger,
            new_messages=[inbound_store(session=stranger, text="remind me in 10 minutes to drink water")],
            mentioned=False,
        )
    assert mine.action == "offline_list"
    assert theirs.action == "offline_notice"
    assert not ScheduledMessage.objects.filter(session=stranger).exists()
