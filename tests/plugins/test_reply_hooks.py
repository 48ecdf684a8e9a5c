"""MaiBot's `maisaka.planner.after_response` and `maisaka.replyer.*` points with the example plugin
`send_hooks` (real maibot-plugin-sdk, in its runner subprocess) and chat's real session runtime talking
to FakeLLM: an after_response handler sees the planner's answer in MaiBot's shape and removes a reply
call (the cycle ends silent, nothing is sent); the replyer handlers see each reply before it is sent
and rewrite it, withdraw it, or send it back for another (the model is told, and answers again)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from chat.models import Direction, Message, PlannerCycle, ToolCallRecord
from plugins.plugin_apis import call_api
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say, settled  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)

HOOKS = "test.maibot.send-hooks"
CALLER = "test.maibot.api-caller"


async def seen(host, what: str) -> list:
    return await call_api(host.records[CALLER], HOOKS, "seen", {"what": what}, 5.0)


async def sent(session) -> list[str]:
    return [m.text async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]


def told(body) -> str:
    """What the tools told the model so far in this request."""
    return json.dumps([m for m in body["messages"] if m.get("role") == "tool"], ensure_ascii=False)


async def test_after_response_sees_the_answer_and_removing_its_reply_leaves_the_cycle_silent(
    load_plugins, fake_llm, runtimes, make_session
):
    host = await sync_to_async(load_plugins)("send_hooks", "api_caller")
    session = await sync_to_async(make_session)()
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "please drop me", "quote_message_id": None})
    await say(session, "hello?")
    await settled(runtimes, session)
    assert await sent(session) == []
    cycle = await PlannerCycle.objects.filter(session=session).alatest("id")
    assert cycle.action == "no_reply"
    assert "removed every tool call" in cycle.outcome
    (answer,) = await seen(host, "after_response")
    (call,) = answer["tool_calls"]
    assert call["function"] == {"name": "reply", "arguments": {"text": "please drop me", "quote_message_id": None}}
    assert answer["session_id"] == answer["stream_id"] == session.session_id
    assert answer["response"] == ""
    assert {"prompt_tokens", "completion_tokens", "total_tokens", "built_message_count"} <= set(answer)
    assert await seen(host, "replyer_after") == []  # removed before the replyer saw it


async def test_the_replyer_hooks_rewrite_a_reply_before_it_is_sent(load_plugins, fake_llm, runtimes, make_session):
    host = await sync_to_async(load_plugins)("send_hooks", "api_caller")
    session = await sync_to_async(make_session)()
    inbound = await say(session, "hi there", platform_message_id="555")
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "please rewrite", "quote_message_id": "#555"})

    async def replied() -> list[str]:
        return await sent(session)

    await wait_for_async(replied, what="the reply")
    await settled(runtimes, session)
    assert await sent(session) == ["rewritten reply"]
    (before,) = await seen(host, "replyer_before")
    assert before["reply_message_id"] == inbound.platform_message_id == "555"
    assert before["session_id"] == session.session_id
    assert (before["request_type"], before["attempt"], before["reply_tool_args"]) == ("replyer", 1, {})
    assert await seen(host, "replyer_after") == ["please rewrite"]
    record = await ToolCallRecord.objects.filter(cycle__session=session, name="reply").alatest("id")
    assert record.arguments["text"] == "rewritten reply"  # what ran is what is recorded


async def test_a_withdrawn_reply_is_not_sent_and_the_model_is_told(load_plugins, fake_llm, runtimes, make_session):
    await sync_to_async(load_plugins)("send_hooks", "api_caller")
    session = await sync_to_async(make_session)()

    def answer(body):
        if "another reply" in told(body):
            return fake_llm.tool_call("no_reply", {"reason": "told twice"})
        if "withdrew" in told(body):
            return fake_llm.tool_call("reply", {"text": "say it again, once more"})
        return fake_llm.tool_call("reply", {"text": "withdraw this"})

    fake_llm.default = answer
    await say(session, "hello?")
    await settled(runtimes, session)
    assert await sent(session) == []
    records = [r async for r in ToolCallRecord.objects.filter(cycle__session=session).order_by("id")]
    assert [(r.name, r.ok, r.result.get("error", {}).get("code")) for r in records] == [
        ("reply", False, "withdrawn"),
        ("reply", False, "withdrawn"),
        ("no_reply", True, None),
    ]
    assert "too rude" in records[1].result["error"]["message"]
    cycle = await PlannerCycle.objects.filter(session=session).alatest("id")
    assert cycle.action == "no_reply"
