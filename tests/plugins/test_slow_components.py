"""A plugin tool or command that never answers, against chat's real session runtime and FakeLLM, with the
test plugin `slowtool` (real maibot-plugin-sdk): stalled in ten chats at once (more than any pool of
threads the host keeps), or blocking its runner outright, it holds nothing another chat needs: that
chat's planner call and reply come at once, while each stalled call is cut at chat.tool_timeout with the
error result the model sees, recorded as before. The same with the model offline."""

from __future__ import annotations

import json
import os
import time

import pytest
from asgiref.sync import sync_to_async

from chat.models import Direction, Message, PlannerCycle, ToolCallRecord
from core import config
from plugins.plugin_apis import call_api
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async
from tests.plugins.conftest import load_ipc_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

SLOW = "test.maibot.slowtool"
CHATS = 10  # more chats stalled at once than the engine's pool has tool threads
TOOL_TIMEOUT = 10.0


def planned(fake_llm, text: str) -> int:
    """The model calls made for a chat that said `text` (its first round only)."""
    return sum(
        text in json.dumps(r["messages"], ensure_ascii=False) and r["messages"][-1]["role"] != "tool"
        for r in fake_llm.requests
    )


def answered(session, text: str) -> int:
    return Message.objects.filter(session=session, direction=Direction.OUT, text=text).count()


@pytest.fixture
def slowtool(tmp_path):
    host = load_ipc_plugins(tmp_path / "plugins", "slowtool")
    yield host
    host.stop()


async def stalled(host) -> int:
    """How many calls wait in the plugin now (its own count, through its public API)."""
    return await call_api(host.records[SLOW], SLOW, "stalled", {}, 5.0)


async def stall_in_every_chat(host, make_session, text: str) -> list:
    """CHATS chats say `text`; returns them once the plugin holds a call of each at the same time."""
    sessions = [await sync_to_async(make_session)() for _ in range(CHATS)]
    for session in sessions:
        await say(session, text)

    async def all_stalled() -> bool:
        return await stalled(host) == CHATS

    # All at once: well before the first of them is cut at the tool timeout.
    await wait_for_async(all_stalled, timeout=TOOL_TIMEOUT - 2, what="a call stalled in every chat at once")
    return sessions


async def another_chat_is_answered_at_once(fake_llm, make_session) -> None:
    said = time.monotonic()
    other = await sync_to_async(make_session)()
    await say(other, "hello, anyone there?")
    await wait_for_async(lambda: answered(other, "hi") == 1, timeout=TOOL_TIMEOUT / 2, what="the other chat's reply")
    assert time.monotonic() - said < TOOL_TIMEOUT / 2
    assert planned(fake_llm, "hello, anyone there?") == 1


async def test_a_plugin_tool_stalled_in_ten_chats_never_delays_another_chats_planner_and_is_cut_at_tool_timeout(
    fake_llm, runtimes, make_session, slowtool
):
    def answer(body):
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return fake_llm.tool_call("reply", {"text": "looked it up"})
        if "please look up stall" in json.dumps(messages, ensure_ascii=False):
            return fake_llm.tool_call("slow_lookup", {"word": "stall"})
        return fake_llm.tool_call("reply", {"text": "hi"})

    fake_llm.default = answer
    with config.override(chat={"tool_timeout": TOOL_TIMEOUT}):
        started = time.monotonic()
        sessions = await stall_in_every_chat(slowtool, make_session, "please look up stall")
        await another_chat_is_answered_at_once(fake_llm, make_session)
        assert await stalled(slowtool) == CHATS  # still waiting meanwhile

        # Each stalled call is cut at tool_timeout (not the hour it asked for), and the model is told.
        async def cut() -> bool:
            return await ToolCallRecord.objects.filter(name="slow_lookup").acount() == CHATS

        await wait_for_async(cut, timeout=TOOL_TIMEOUT + 20, what="the cuts")
        assert TOOL_TIMEOUT <= time.monotonic() - started < TOOL_TIMEOUT + 20
    timeout_result = {
        "ok": False,
        "error": {"code": "tool_timeout", "message": f"slow_lookup did not finish within {TOOL_TIMEOUT:g}s"},
    }
    records = [r async for r in ToolCallRecord.objects.filter(name="slow_lookup")]
    assert [(r.ok, r.arguments, r.result) for r in records] == [(False, {"word": "stall"}, timeout_result)] * CHATS
    await wait_for_async(
        lambda: sum(answered(s, "looked it up") for s in sessions) == CHATS, what="the stalled chats' replies"
    )
    told = [json.loads(r["messages"][-1]["content"]) for r in fake_llm.requests if r["messages"][-1]["role"] == "tool"]
    assert told == [timeout_result] * CHATS
    assert await PlannerCycle.objects.filter(session__in=sessions, action="reply").acount() == CHATS
    record = slowtool.records[SLOW]
    assert await stalled(slowtool) == 0  # cancelled in the runner
    assert record.runner_pid is not None and record.restarts == 0


async def test_a_plugin_tool_that_blocks_its_runner_never_delays_another_chat_and_is_cut_at_tool_timeout(
    fake_llm, runtimes, make_session, slowtool
):
    def answer(body):
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return fake_llm.tool_call("reply", {"text": "looked it up"})
        if "please look up freeze" in json.dumps(messages, ensure_ascii=False):
            return fake_llm.tool_call("slow_lookup", {"word": "freeze"})
        return fake_llm.tool_call("reply", {"text": "hi"})

    fake_llm.default = answer
    record = slowtool.records[SLOW]
    with config.override(chat={"tool_timeout": TOOL_TIMEOUT}):
        frozen = await sync_to_async(make_session)()
        started = time.monotonic()
        await say(frozen, "please look up freeze")
        await wait_for_async(lambda: record.calls == 1, what="the call handed to the runner")
        await another_chat_is_answered_at_once(fake_llm, make_session)

        await wait_for_async(lambda: answered(frozen, "looked it up") == 1, timeout=TOOL_TIMEOUT + 20, what="the cut")
        assert TOOL_TIMEOUT <= time.monotonic() - started < TOOL_TIMEOUT + 20
    cut = await ToolCallRecord.objects.aget(name="slow_lookup")
    assert (cut.ok, cut.result["error"]) == (
        False,
        {"code": "tool_timeout", "message": f"slow_lookup did not finish within {TOOL_TIMEOUT:g}s"},
    )
    # The runner could not take the cancel: it was killed, and is back.
    await wait_for_async(lambda: record.restarts == 1 and record.runner_state == "running", what="the restart")
    assert any("TOOL slow_lookup blocked its runner; the runner was killed" in e for e in record.recent_errors)
    assert await stalled(slowtool) == 0


async def test_plugin_api_calls_stalled_in_many_chats_leave_the_capabilities_to_other_chats(
    fake_llm, runtimes, make_session, slowtool
):
    """A plugin tool asking another plugin's API that never answers, in more chats than the host's loop
    has worker threads: the API calls hold none of them, so another chat's plugin tool still reads the
    chat through a capability at once."""
    chats = min(32, (os.cpu_count() or 1) + 4) + 2  # asyncio's default executor, plus two

    def answer(body):
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return fake_llm.tool_call("reply", {"text": "done: " + messages[-1]["content"]})
        text = json.dumps(messages, ensure_ascii=False)
        if "please relay" in text:
            return fake_llm.tool_call("relay", {})
        if "please count" in text:
            return fake_llm.tool_call("recent", {})
        return fake_llm.tool_call("reply", {"text": "hi"})

    fake_llm.default = answer
    with config.override(chat={"tool_timeout": TOOL_TIMEOUT}):
        for _ in range(chats):
            await say(await sync_to_async(make_session)(), "please relay")

        async def all_stalled() -> bool:
            return await stalled(slowtool) == chats

        await wait_for_async(all_stalled, timeout=TOOL_TIMEOUT - 2, what="an API call stalled in every chat at once")
        said = time.monotonic()
        other = await sync_to_async(make_session)()
        await say(other, "please count")
        counted = await wait_for_async(
            lambda: Message.objects.filter(session=other, direction=Direction.OUT).first(),
            timeout=TOOL_TIMEOUT / 2,
            what="the other chat's answer",
        )
        assert time.monotonic() - said < TOOL_TIMEOUT / 2
        assert json.loads(counted.text.removeprefix("done: ")) == {"ok": True, "result": {"content": "1 recent"}}
        assert await stalled(slowtool) == chats


async def test_a_plugin_command_stalled_in_ten_chats_never_delays_another_chats_planner_and_is_cut_at_tool_timeout(
    fake_llm, runtimes, make_session, slowtool
):
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "hi"})
    with config.override(chat={"tool_timeout": TOOL_TIMEOUT}):
        started = time.monotonic()
        sessions = await stall_in_every_chat(slowtool, make_session, "/stall now")
        await another_chat_is_answered_at_once(fake_llm, make_session)
        assert await stalled(slowtool) == CHATS

        # Each command is cut at tool_timeout; a command that failed does not intercept: the planner
        # sees the message and answers.
        await wait_for_async(
            lambda: sum(answered(s, "hi") for s in sessions) == CHATS,
            timeout=TOOL_TIMEOUT + 20,
            what="the stalled chats' answers",
        )
        assert TOOL_TIMEOUT <= time.monotonic() - started < TOOL_TIMEOUT + 20
    assert planned(fake_llm, "/stall now") == CHATS
    outcomes = [c.outcome async for c in PlannerCycle.objects.filter(session__in=sessions, action="command_passed")]
    assert (
        outcomes
        == [f"plugin command {SLOW}.stall failed: PluginCallTimeout: did not finish within {TOOL_TIMEOUT:g}s"] * CHATS
    )
    assert await stalled(slowtool) == 0 and slowtool.records[SLOW].restarts == 0


async def test_offline_a_stalled_plugin_command_never_delays_another_chats_answer(runtimes, make_session, slowtool):
    assert config.get_config().offline
    with config.override(chat={"tool_timeout": TOOL_TIMEOUT, "debounce_seconds": 0.2}, bot={"language": "en"}):
        stuck = await sync_to_async(make_session)()
        started = time.monotonic()
        await say(stuck, "/stall now")

        async def one_stalled() -> bool:
            return await stalled(slowtool) == 1

        await wait_for_async(one_stalled, timeout=TOOL_TIMEOUT - 2, what="the command to stall")
        said = time.monotonic()
        other = await sync_to_async(make_session)()
        await say(other, "hello")

        def noticed(session) -> bool:
            return Message.objects.filter(
                session=session, direction=Direction.OUT, text__startswith="(Offline"
            ).exists()

        await wait_for_async(lambda: noticed(other), timeout=TOOL_TIMEOUT / 2, what="the other chat's answer")
        assert time.monotonic() - said < TOOL_TIMEOUT / 2
        assert await stalled(slowtool) == 1

        # Cut at tool_timeout: the command did not handle the message, so the offline notice answers it.
        await wait_for_async(lambda: noticed(stuck), timeout=TOOL_TIMEOUT + 20, what="the cut")
        assert TOOL_TIMEOUT <= time.monotonic() - started < TOOL_TIMEOUT + 20
    errors = slowtool.records[SLOW].recent_errors
    assert [e.split(" ", 1)[1] for e in errors] == [
        f"COMMAND stall: PluginCallTimeout: did not finish within {TOOL_TIMEOUT:g}s"
    ]
