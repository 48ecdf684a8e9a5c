"""The planner under a daily budget, end to end in-process: once the cap is reached the next message
costs no model call and gets the offline answer (groups: silence), and the next local day the model
answers again (injected clock)."""

from datetime import datetime, timedelta

import pytest

from chat.agent import budget
from chat.models import Direction, LLMCall, Message, PlannerCycle
from core import config
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say, settled  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def day(monkeypatch):
    tz = config.get_config().tzinfo
    now = {"at": datetime.now(tz).replace(hour=15, minute=0, second=0, microsecond=0)}
    monkeypatch.setattr(budget, "clock", lambda: now["at"])
    return now


@pytest.fixture
def capped(fake_llm):
    # One planner call (100 + 20 tokens) spends the day's budget.
    with config.override(llm={"budgets": [{"scope": "task", "target": "planner", "daily_tokens": 100}]}):
        yield fake_llm


async def replies(session) -> list[str]:
    return [m.text async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]


async def test_over_budget_the_next_message_gets_the_offline_answer_and_the_next_day_the_model(
    capped, runtimes, make_session, day
):
    private = await _session(make_session)
    capped.script(capped.tool_call("reply", {"text": "pong"}))
    await say(private, "ping")
    await settled(runtimes, private)
    assert await replies(private) == ["pong"]

    await say(private, "are you there?")
    await settled(runtimes, private)
    *_, notice = await replies(private)
    assert notice.startswith("（今天的模型额度用完了，00:00 恢复。")  # bot.language zh: back at local midnight
    assert len(capped.requests) == 1 and await LLMCall.objects.acount() == 1
    cycle = await PlannerCycle.objects.order_by("-started_at").afirst()
    assert cycle.action == "offline_notice" and "daily budget reached: task planner" in cycle.reasoning

    day["at"] += timedelta(days=1)  # the next local day: the model answers again
    capped.script(capped.tool_call("reply", {"text": "back"}))
    await say(private, "hello again")
    await settled(runtimes, private)
    assert (await replies(private))[-1] == "back" and len(capped.requests) == 2


async def test_over_budget_a_group_hears_nothing_but_command_answers(capped, runtimes, make_session, day):
    group = await _session(make_session, "group")
    today = budget.local_day(day["at"], config.get_config().tzinfo)
    from chat.models import LLMSpend

    await LLMSpend.objects.acreate(day=today, scope="task", target="planner", tokens=100)
    await say(group, "麦麦 are you there?", sender_id="u1")
    await settled(runtimes, group)
    assert await replies(group) == [] and capped.requests == []
    await say(group, "/list", sender_id="u1")
    await settled(runtimes, group)
    [answer] = await replies(group)
    assert answer and capped.requests == []


async def _session(make_session, kind: str = "private"):
    from asgiref.sync import sync_to_async

    return await sync_to_async(make_session)(kind)
