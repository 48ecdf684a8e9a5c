"""A failing model is polite: a private chat's user is told (chat.model_failure_reply) instead of silence,
once per interval, through the send service; a group is not; an empty reply turns it off. The real
openai client against FakeLLM answering 401, as a wrong key does."""

from __future__ import annotations

import pytest

from chat.models import Direction, Message, PlannerCycle, SourceKind
from core import config
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)

WRONG_KEY = "Incorrect API key provided: sk-wr***ng."


async def outbound(session) -> list[Message]:
    return [m async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]


async def finished(session, n: int) -> None:
    async def done() -> bool:
        return await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount() >= n

    await wait_for_async(done, what=f"{n} finished cycle(s)")


@pytest.fixture
def private(make_session):
    return make_session(user_nickname="Alice")


@pytest.fixture
def group(make_session):
    return make_session(chat_type="group")


@pytest.fixture
def another_private(make_session):
    return make_session(user_nickname="Bob")


async def test_a_wrong_key_tells_a_private_chat_once_per_interval(fake_llm, runtimes, private):
    fake_llm.default = lambda body: fake_llm.error(401, WRONG_KEY)
    await say(private, "你好")
    await finished(private, 1)
    [told] = await outbound(private)
    assert told.text == config.get_config().chat.model_failure_reply and told.source_kind == SourceKind.REPLY
    assert told.extra["model_failure"] is True
    cycle = await PlannerCycle.objects.aget(session=private)
    assert cycle.action == "error" and "HTTP 401" in cycle.error and "told the user" in cycle.outcome

    await say(private, "在吗？")
    await finished(private, 2)
    assert len(await outbound(private)) == 1  # within the interval: not again

    with config.override(chat={"model_failure_reply_interval": 0}):
        await say(private, "还在吗？")
        await finished(private, 3)
    assert len(await outbound(private)) == 2


async def test_a_group_is_not_told_and_an_empty_reply_turns_it_off(fake_llm, runtimes, group, another_private):
    fake_llm.default = lambda body: fake_llm.error(401, WRONG_KEY)
    with config.override(chat={"talk_frequency": 1.0}):
        await say(group, "@麦麦 你好")
        await finished(group, 1)
    assert await outbound(group) == []

    with config.override(chat={"model_failure_reply": ""}):
        await say(another_private, "hello")
        await finished(another_private, 1)
    assert await outbound(another_private) == []
