"""Runtime lifecycle and restraint: group-chat rule, the runtime cap, idle eviction, clean shutdown."""

import pytest
from asgiref.sync import sync_to_async

from chat.models import Direction, Message, PlannerCycle
from chat.planner import group_bar, mentions_bot
from core import config
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say, settled  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


async def sent_texts(session) -> list[str]:
    return [m.text async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]


async def wait_cycles(session, n):
    async def check():
        return await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount() >= n

    await wait_for_async(check, what=f"{n} finished cycles")


def test_mention_rule():
    cfg = config.get_config()  # nickname 麦麦, aliases MaiBot / 麦麦
    said = lambda text, quote="": Message(text=text, reply_to_platform_id=quote)  # noqa: E731
    assert mentions_bot(said("麦麦你好"), cfg)
    assert mentions_bot(said("hey maibot, what's up"), cfg)
    assert mentions_bot(said("@<麦麦:3355> 在吗"), cfg)
    assert not mentions_bot(said("@<Alice:1> lunch?"), cfg)
    assert mentions_bot(Message(text="@<小麦:3355> hi", receiver_id="3355"), cfg)  # the bot's own account id
    assert not mentions_bot(said("lunch anyone?"), cfg)
    assert mentions_bot(said("yes", quote="42"), cfg, bot_message_ids={"42"})
    assert not mentions_bot(said("yes", quote="43"), cfg, bot_message_ids={"42"})


def test_group_bar_backs_off_after_silence_and_zero_frequency_means_only_when_mentioned():
    assert [group_bar(0.5, s) for s in range(6)] == [2, 4, 8, 16, 32, 32]
    assert group_bar(1.0, 0) == 1 and group_bar(0.3, 0) == 4
    assert group_bar(0.0, 0) == float("inf")


async def test_group_chatter_costs_nothing_until_mentioned(fake_llm, runtimes, make_session):
    group = await sync_to_async(make_session)(chat_type="group")
    fake_llm.script(fake_llm.tool_call("reply", {"text": "我在！"}))
    with config.override(chat={"talk_frequency": 0.0}):
        for text in ("anyone for lunch?", "I'm in", "me too"):
            await say(group, text, sender_nickname="Bob")
            await settled(runtimes, group)
        assert fake_llm.requests == [] and await PlannerCycle.objects.filter(session=group).acount() == 0
        await say(group, "麦麦 你来吗？", sender_nickname="Bob")
        await wait_cycles(group, 1)
    assert await sent_texts(group) == ["我在！"]
    prompt = fake_llm.requests[0]["messages"][1]["content"]
    assert "You were mentioned" in prompt and "Bob: anyone for lunch?" in prompt  # chatter kept as history
    offered = {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    assert "reply" in offered and not offered & {"schedule_private_message", "list_scheduled_private_messages"}


async def test_unaddressed_group_talk_backs_off_after_each_silent_turn(fake_llm, runtimes, make_session):
    group = await sync_to_async(make_session)(chat_type="group")
    fake_llm.default = lambda body: fake_llm.tool_call("no_reply", {"reason": "not my business"})
    with config.override(chat={"talk_frequency": 0.5, "debounce_seconds": 0.05}):
        # Bar 2: the first message alone costs nothing, the second one asks the model.
        await say(group, "chatter 1", sender_nickname="Bob")
        await settled(runtimes, group)
        assert fake_llm.requests == []
        await say(group, "chatter 2", sender_nickname="Bob")
        await wait_cycles(group, 1)
        assert "Nobody addressed you" in fake_llm.requests[0]["messages"][1]["content"]
        # It stayed silent: the bar doubles to 4.
        for i in (3, 4, 5):
            await say(group, f"chatter {i}", sender_nickname="Bob")
            await settled(runtimes, group)
        assert len(fake_llm.requests) == 1
        await say(group, "chatter 6", sender_nickname="Bob")
        await wait_cycles(group, 2)
    assert len(fake_llm.requests) == 2 and await sent_texts(group) == []


async def test_runtime_cap_stops_the_least_recently_active(fake_llm, runtimes, make_session):
    sessions = [await sync_to_async(make_session)() for _ in range(3)]
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "hi"})
    with config.override(chat={"max_runtimes": 2}):
        for i, session in enumerate(sessions, 1):
            await say(session, "hello")
            await wait_cycles(session, 1)
            assert len(runtimes.runtimes) == min(i, 2)
        assert runtimes.get(sessions[0].pk) is None
        assert runtimes.get(sessions[1].pk) is not None and runtimes.get(sessions[2].pk) is not None
        # The stopped session starts again on its next message (and evicts the next oldest).
        await say(sessions[0], "me again")
        await wait_cycles(sessions[0], 2)
        assert runtimes.get(sessions[0].pk) is not None and runtimes.get(sessions[1].pk) is None
    assert [len(await sent_texts(s)) for s in sessions] == [2, 1, 1]


async def test_idle_runtime_is_evicted_and_restarts_on_the_next_message(fake_llm, runtimes, make_session):
    session = await sync_to_async(make_session)()
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "hi"})
    with config.override(chat={"idle_evict_seconds": 0.5}):
        await say(session, "hello")
        await wait_cycles(session, 1)
        first = runtimes.get(session.pk)

        async def gone():
            # The runtime closes at once; its consumer then leaves its group and ends.
            return runtimes.get(session.pk) is None and first.task.done()

        await wait_for_async(gone, timeout=10, what="idle eviction")
        assert not first.task.cancelled() and first.task.exception() is None
        await say(session, "back")
        await wait_cycles(session, 2)
    assert await sent_texts(session) == ["hi", "hi"]
    assert "back" in fake_llm.requests[1]["messages"][1]["content"]


async def test_shutdown_mid_cycle_records_the_cut_cycle_and_sends_nothing(fake_llm, runtimes, make_session):
    session = await sync_to_async(make_session)()
    fake_llm.script(fake_llm.delay(1.0, fake_llm.tool_call("reply", {"text": "never"})))
    await say(session, "think hard")

    async def asked():
        return len(fake_llm.requests) == 1

    await wait_for_async(asked, what="the model to be asked")
    stopped = await runtimes.shutdown()
    assert stopped == 1 and runtimes.runtimes == {}
    cycle = await PlannerCycle.objects.aget(session=session)
    assert cycle.action == "cancelled" and "stopped" in cycle.error and cycle.ended_at is not None

    async def late_answer_served() -> bool:
        return fake_llm.answered >= 1

    await wait_for_async(late_answer_served, timeout=10, what="the model's answer to the cut cycle")
    assert await sent_texts(session) == []
