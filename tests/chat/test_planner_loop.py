"""The planner loop end to end in-process: inbound signal → runtime → real openai client → FakeLLM →
tools → outbox rows and the cycle record."""

import json
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.models import DeliveryStatus, Direction, LLMCall, Message, PlannerCycle, SourceKind, ToolCallRecord
from core import config
from scheduling.dispatcher import deliver_due
from scheduling.models import ScheduledMessage, ScheduledStatus
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say, settled  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


async def outbound(session) -> list[Message]:
    return [m async for m in Message.objects.filter(session=session, direction=Direction.OUT).order_by("id")]


async def cycles(session) -> list[PlannerCycle]:
    return [c async for c in PlannerCycle.objects.filter(session=session).order_by("started_at")]


async def finished_cycles(session, n=1):
    async def check():
        done = await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount()
        return done >= n

    await wait_for_async(check, what=f"{n} finished cycle(s)")
    return await cycles(session)


@pytest.fixture
def private(make_session):
    return make_session(user_nickname="Alice")


async def test_ping_costs_one_llm_call_and_leaves_a_pending_reply(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.tool_call("reply", {"text": "pong"}))
    await say(private, "ping")
    [cycle] = await finished_cycles(private)
    [reply] = await outbound(private)
    assert (reply.text, reply.source_kind, reply.delivery_status) == ("pong", SourceKind.REPLY, DeliveryStatus.PENDING)
    assert reply.extra["cycle_id"] == str(cycle.cycle_id)
    assert len(fake_llm.requests) == 1
    assert cycle.action == "reply" and not cycle.error and not cycle.replanned
    assert {"observe_ms", "prompt_ms", "plan_ms", "execute_ms", "record_ms", "total_ms"} <= set(cycle.timings)
    [call] = [c async for c in LLMCall.objects.filter(cycle=cycle)]
    assert call.purpose == "planner" and call.session_id == private.pk
    [record] = [r async for r in ToolCallRecord.objects.filter(cycle=cycle)]
    assert record.name == "reply" and record.tool_call_id and record.result["ok"] is True
    # What the model saw: persona first, then the tools, the history with the message, the time.
    request = fake_llm.requests[0]
    system, user = request["messages"]
    assert config.get_config().bot.persona in system["content"]
    assert "Alice: ping" in user["content"] and "Current time: " in user["content"]
    offered = {t["function"]["name"] for t in request["tools"]}
    assert {"reply", "no_reply", "schedule_private_message", "list_scheduled_private_messages"} <= offered
    assert "send_emoji" not in offered  # no stickers stored
    assert cycle.prompt[:2] == request["messages"]


async def test_reminder_is_scheduled_confirmed_and_later_delivered_without_the_model(fake_llm, runtimes, private):
    due = (timezone.now() + timedelta(minutes=1)).replace(microsecond=0)
    send_at = due.isoformat()
    fake_llm.script(
        fake_llm.tool_call("schedule_private_message", {"send_at": send_at, "message_text": "drink water 喝水"}),
        fake_llm.tool_call("reply", {"text": "OK, in a minute."}),
    )
    await say(private, "remind me in a minute to drink water")
    [cycle] = await finished_cycles(private)
    assert cycle.action == "reply"
    [schedule, _reply] = [r async for r in ToolCallRecord.objects.filter(cycle=cycle).order_by("id")]
    task = await ScheduledMessage.objects.aget(session=private)
    assert task.created_by_tool_call_id == schedule.tool_call_id and schedule.result["task_id"] == task.pk
    # The tool's result went back to the model in the same cycle.
    tool_message = fake_llm.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == schedule.tool_call_id
    assert json.loads(tool_message["content"])["task_id"] == task.pk
    assert [m.text for m in await outbound(private)] == ["OK, in a minute."]

    calls_before = len(fake_llm.requests)

    # The dispatcher's rounds with an injected clock: a second early, nothing; at its time, sent.
    assert (await sync_to_async(deliver_due)(due - timedelta(seconds=1))).claimed == 0
    assert (await sync_to_async(deliver_due)(due)).claimed == 1
    assert await ScheduledMessage.objects.filter(pk=task.pk, status=ScheduledStatus.SENT).aexists()
    sent = (await outbound(private))[-1]
    assert (sent.text, sent.source_kind) == ("drink water 喝水", SourceKind.SCHEDULED_SEND)
    await settled(runtimes, private)
    assert len(fake_llm.requests) == calls_before  # delivery needed no model

    # The next cycle shows the scheduled send in the history, marked as such.
    fake_llm.script(fake_llm.tool_call("no_reply", {"reason": "thanks needs no answer"}))
    await say(private, "thanks")
    await finished_cycles(private, 2)
    assert "(you, scheduled message): drink water 喝水" in fake_llm.requests[-1]["messages"][1]["content"]


async def test_message_during_thinking_discards_the_stale_plan_and_replans(fake_llm, runtimes, private):
    fake_llm.script(
        fake_llm.delay(1.0, fake_llm.tool_call("reply", {"text": "stale answer"})),
        fake_llm.tool_call("reply", {"text": "fresh answer"}),
    )
    await say(private, "first")

    async def thinking():
        return len(fake_llm.requests) == 1

    await wait_for_async(thinking, what="the model to be asked")
    await say(private, "second, while you think")
    [cycle] = await finished_cycles(private)
    assert [m.text for m in await outbound(private)] == ["fresh answer"]
    assert cycle.replanned is True and cycle.action == "reply"
    assert "discarded a stale plan (reply)" in cycle.outcome
    assert await LLMCall.objects.filter(cycle=cycle).acount() == 2
    assert "second, while you think" in fake_llm.requests[1]["messages"][1]["content"]
    await settled(runtimes, private)
    assert await PlannerCycle.objects.filter(session=private).acount() == 1  # nothing left to observe


async def test_a_burst_inside_the_debounce_window_is_one_cycle(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.tool_call("reply", {"text": "got all three"}))
    with config.override(chat={"debounce_seconds": 0.6}):
        for text in ("one", "two", "three"):
            await say(private, text)
        await finished_cycles(private)
        await settled(runtimes, private)
    assert len(await cycles(private)) == 1 and len(fake_llm.requests) == 1
    prompt = fake_llm.requests[0]["messages"][1]["content"]
    assert all(f"Alice: {t}" in prompt for t in ("one", "two", "three"))
    assert prompt.index("--- new since your last turn ---") < prompt.index("Alice: one")


async def test_wake_from_a_worker_thread(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.tool_call("reply", {"text": "woken"}))
    await say(private, "hi from a thread", from_thread=True)
    await finished_cycles(private)
    assert [m.text for m in await outbound(private)] == ["woken"]


async def test_llm_500_is_recorded_the_user_is_told_and_the_loop_goes_on(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.error(500), fake_llm.tool_call("reply", {"text": "back again"}))
    await say(private, "hello?")
    [failed] = await finished_cycles(private)
    assert failed.action == "error" and "HTTP 500" in failed.error
    sorry = config.get_config().chat.model_failure_reply
    assert [m.text for m in await outbound(private)] == [sorry]  # not silence (chat.model_failure_reply)
    await say(private, "hello again")
    await finished_cycles(private, 2)
    assert [m.text for m in await outbound(private)] == [sorry, "back again"]


async def test_llm_timeout_is_recorded_and_only_the_failure_reply_is_sent(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.delay(1.2, fake_llm.tool_call("reply", {"text": "too late"})))
    with config.override(llm={"timeout": 0.4}):
        await say(private, "are you there")
        [cycle] = await finished_cycles(private)
    assert cycle.action == "error" and "timeout" in cycle.error

    async def late_answer_served() -> bool:
        return fake_llm.answered >= 1

    await wait_for_async(late_answer_served, timeout=10, what="the model's late answer")
    await settled(runtimes, private)
    assert [m.text for m in await outbound(private)] == [config.get_config().chat.model_failure_reply]


async def test_malformed_arguments_and_unknown_tools_go_back_to_the_model(fake_llm, runtimes, private):
    fake_llm.script(
        fake_llm.tool_calls(("reply", "{not json"), ("launch_rockets", {"count": 3}), ("reply", {"txt": "typo"})),
        fake_llm.tool_call("reply", {"text": "sorry, here it is"}),
    )
    await say(private, "hi")
    [cycle] = await finished_cycles(private)
    records = [r async for r in ToolCallRecord.objects.filter(cycle=cycle).order_by("id")]
    assert [(r.name, r.ok) for r in records] == [
        ("reply", False),
        ("launch_rockets", False),
        ("reply", False),
        ("reply", True),
    ]
    assert [r.result.get("error", {}).get("code") for r in records[:3]] == [
        "invalid_arguments",
        "unknown_tool",
        "invalid_arguments",
    ]
    assert records[0].raw_arguments == "{not json"
    tool_results = [m for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 3 and "unknown_tool" in tool_results[1]["content"]
    assert [m.text for m in await outbound(private)] == ["sorry, here it is"]
    assert cycle.action == "reply" and not cycle.error


async def test_round_cap_ends_the_cycle_without_sending(fake_llm, runtimes, private):
    fake_llm.default = lambda body: fake_llm.tool_call("list_scheduled_private_messages", {})
    with config.override(chat={"max_rounds": 3}):
        await say(private, "loop forever")
        [cycle] = await finished_cycles(private)
    assert cycle.action == "max_rounds" and "3" in cycle.error
    assert len(fake_llm.requests) == 3 and await outbound(private) == []


async def test_plain_text_answer_is_sent_in_private_but_not_markup(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.text("  hello there  "), fake_llm.text('{"name": "reply", "arguments": {}}'))
    await say(private, "hi")
    [first] = await finished_cycles(private)
    assert first.action == "reply" and [m.text for m in await outbound(private)] == ["hello there"]
    await say(private, "and now?")
    second = (await finished_cycles(private, 2))[-1]
    assert second.action == "no_reply" and "plain text not sent" in second.outcome
    assert len(await outbound(private)) == 1


async def test_two_replies_in_one_answer_send_only_one(fake_llm, runtimes, private):
    fake_llm.script(fake_llm.tool_calls(("reply", {"text": "once"}), ("reply", {"text": "twice"})))
    await say(private, "hi")
    await finished_cycles(private)
    assert [m.text for m in await outbound(private)] == ["once"]


async def test_quote_uses_the_platform_id_and_an_unknown_id_is_ignored(fake_llm, runtimes, private):
    fake_llm.script(
        fake_llm.tool_call("reply", {"text": "quoted", "quote_message_id": "#777001"}),
        fake_llm.tool_call("reply", {"text": "unquoted", "quote_message_id": "404"}),
    )
    await say(private, "quote me", platform_message_id="777001")
    await finished_cycles(private)
    await say(private, "again")
    await finished_cycles(private, 2)
    first, second = await outbound(private)
    assert first.reply_to_platform_id == "777001" and first.segments[0] == {"type": "reply", "data": "777001"}
    assert second.reply_to_platform_id == "" and second.text == "unquoted"
    assert "#777001 [" in fake_llm.requests[0]["messages"][1]["content"]


async def test_previous_cycles_and_context_blocks_are_in_the_prompt(fake_llm, runtimes, private):
    from chat import components as context

    context.register_context_block("test_inner_state", lambda s: "feeling: sleepy 困", order=10)
    try:
        fake_llm.script(
            fake_llm.tool_call("no_reply", {"reason": "nothing to add"}),
            fake_llm.tool_call("reply", {"text": "ok"}),
        )
        await say(private, "first")
        await finished_cycles(private)
        await say(private, "second")
        await finished_cycles(private, 2)
    finally:
        context._blocks.pop("test_inner_state")
    _system, user = fake_llm.requests[1]["messages"]
    assert "feeling: sleepy 困" in user["content"]
    assert "no_reply — why: nothing to add" in user["content"]
    order = [user["content"].index(s) for s in ("feeling: sleepy", "Your last turns", "Chat history", "Current time")]
    assert order == sorted(order)


async def test_no_reply_looks_once_more_after_the_timeout(fake_llm, runtimes, private):
    fake_llm.script(
        fake_llm.tool_call("no_reply", {"reason": "wait"}),
        fake_llm.tool_call("reply", {"text": "still there?"}),
    )
    # Idle eviction after 1 s: a runtime checks its re-look before idleness, so once it has stopped
    # itself idle, any further look (due 0.5 s after the second cycle) would already have happened.
    with config.override(chat={"no_reply_timeout": 0.5, "idle_evict_seconds": 1.0}):
        await say(private, "brb")
        await finished_cycles(private, 2)
        runtime = runtimes.get(private.pk)

        async def stopped_idle() -> bool:
            return runtimes.get(private.pk) is None and (runtime is None or runtime.task.done())

        await wait_for_async(stopped_idle, timeout=10, what="the runtime to stop idle")
    first, second = await cycles(private)
    assert (first.action, second.action, second.trigger) == ("no_reply", "reply", "no_reply_timeout")
    assert len(fake_llm.requests) == 2  # no second look without a new message


async def test_emoji_is_offered_only_when_stored_and_sent_as_an_emoji_segment(fake_llm, runtimes, private):
    from chat.media import media_store

    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
    await sync_to_async(media_store)(data=png, kind="emoji", description="happy cat 开心")
    fake_llm.script(fake_llm.tool_call("send_emoji", {"description": "开心"}))
    await say(private, "I passed the exam!")
    [cycle] = await finished_cycles(private)
    assert "send_emoji" in {t["function"]["name"] for t in fake_llm.requests[0]["tools"]}
    [sent] = await outbound(private)
    assert cycle.action == "send_emoji" and sent.segments[0]["type"] == "emoji"
    assert sent.source_kind == SourceKind.REPLY


async def test_malformed_provider_answer_is_an_error_not_a_message(fake_llm, runtimes, private):
    fake_llm.script({"id": "broken", "object": "chat.completion", "choices": []})
    await say(private, "hi")
    [cycle] = await finished_cycles(private)
    assert cycle.action == "error" and cycle.error == "not a chat-completions answer"
    # Nothing of the broken answer is sent; the user is told the bot cannot think right now.
    assert [m.text for m in await outbound(private)] == [config.get_config().chat.model_failure_reply]
