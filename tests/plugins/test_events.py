"""Events and hook points, @API, the tool cache and life-loop tools, in-process, with the example plugins
`events` and `api_caller` (real maibot-plugin-sdk) and chat's real session runtime talking to FakeLLM:
a hook stops a message before the planner or rewrites its text; the planner's request carries what a
before_request hook added; a handler that raises or never finishes is recorded and the bot answers
anyway; built-in handlers run in order and `order_change` moves them; plugins call each other's APIs
(full or unique short name, newest version, public only); a cacheable tool answers repeated calls
from its cache until its TTL passes; a life-loop tool is offered to the life loop."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async

from chat import events
from chat.agent.engine import AgentTurn
from chat.agent.llm import ToolCallRequest
from chat.components import LIFE, registry
from chat.events import EventHandler, Point
from chat.models import CycleKind, Direction, Message, PlannerCycle, ToolCallRecord
from core import aio, config
from plugins import cache as plugin_cache
from plugins import events as plugin_events
from plugins import plugin_apis
from plugins.plugin_apis import PluginApiError, call_api
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say, settled  # noqa: F401
from tests.conftest import wait_for, wait_for_async
from tests.plugins.conftest import load_ipc_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

EVENTS = "test.maibot.events"
CALLER = "test.maibot.api-caller"
SLOW = "test.maibot.slowhook"


def seen(host, what: str) -> list:
    """What the events plugin's handlers saw, through its public API (as another plugin would ask)."""
    return asyncio.run(call_api(host.records[CALLER], EVENTS, "seen", {"what": what}, 5.0))


async def aseen(host, what: str) -> list:
    return await call_api(host.records[CALLER], EVENTS, "seen", {"what": what}, 5.0)


def test_handlers_register_by_point_and_unemitted_hooks_are_noted_not_refused(load_plugins):
    host = load_plugins("events", "api_caller")
    record = host.records[EVENTS]
    assert record.state == "loaded"
    notes = {c.name: (c.registered, c.note) for c in record.components}
    assert notes["replyer_hook"] == (False, "the hook maisaka.replyer.before_model_request is not emitted by this host")
    assert notes["bad_policy"] == (False, "send_service.after_send cannot be aborted, so error_policy=abort is refused")
    assert all(ok for name, (ok, _) in notes.items() if name not in ("replyer_hook", "bad_policy"))
    # Blocking before observe, then order (EARLY 50, NORMAL 100, an event handler's 100 - weight, LATE 150).
    assert [h.name.rpartition(":")[2] for h in events.handlers(Point.RECEIVE_AFTER_PROCESS)] == [
        "shouter",
        "stuck_hook",
        "message_counter",
        "receive_observer",
    ]
    plugin_events.emit_start()
    assert seen(host, "on_start") == [True]
    host.stop()
    assert events.handlers() == []


async def test_a_hook_stops_a_message_before_the_planner_and_another_rewrites_its_text(
    load_plugins, fake_llm, runtimes, make_session
):
    host = await sync_to_async(load_plugins)("events", "api_caller")
    session = await sync_to_async(make_session)()
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "ok"})

    spam = await say(session, "buy followers cheap!!")
    await settled(runtimes, session)
    assert fake_llm.requests == []  # stopped before the planner: no model call
    await spam.arefresh_from_db()
    assert spam.extra["hook_aborted_by"] == "plugin:test.maibot.events:spam_guard"
    assert await aseen(host, "before_process") == ["buy followers cheap!!"]

    shout = await say(session, "shout: hello there")
    await wait_for_async(lambda: len(fake_llm.requests) == 1, what="the planner's request")
    await shout.arefresh_from_db()
    assert shout.text == "HELLO THERE"  # stored as the hook left it, and planned on as such
    request = fake_llm.requests[0]
    assert "HELLO THERE" in request["messages"][1]["content"]
    assert "shout:" not in request["messages"][1]["content"]
    # The before_request hook's addition reached the model.
    assert request["messages"][-1] == {"role": "system", "content": "plugin note: the user likes haiku"}
    assert await aseen(host, "before_request") == [session.session_id]

    async def observed() -> bool:  # observe handlers run in the background
        return await aseen(host, "after_process") == await aseen(host, "on_message") == ["HELLO THERE"]

    await wait_for_async(observed, what="the observe handlers to see the rewritten text")


async def test_a_handler_that_raises_or_never_finishes_is_recorded_and_the_bot_answers(
    load_plugins, fake_llm, runtimes, make_session
):
    host = await sync_to_async(load_plugins)("events", "api_caller")
    session = await sync_to_async(make_session)()
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "still here"})
    events.recent_failures.clear()

    def answers() -> int:
        return Message.objects.filter(session=session, direction=Direction.OUT).count()

    # Each answer is awaited before the next message: a message arriving while a cycle is still running
    # makes the planner replan, and the first reply would then rightly never be sent.
    await say(session, "boom goes the filter")
    await wait_for_async(lambda: answers() == 1, what="the answer despite the raise")
    await say(session, "please hang on")
    await wait_for_async(lambda: answers() == 2, what="the answer despite the stuck hook")
    assert len(fake_llm.requests) == 2
    failures = {f.handler: f.error for f in events.recent_failures}
    assert failures["plugin:test.maibot.events:broken_filter"] == "RuntimeError: the filter broke"
    assert failures["plugin:test.maibot.events:stuck_hook"] == "PluginCallTimeout: did not finish within 0.3s"
    errors = host.records[EVENTS].recent_errors
    assert any(e.endswith("EVENT_HANDLER broken_filter: RuntimeError: the filter broke") for e in errors)
    assert any("HOOK_HANDLER stuck_hook:" in e and "did not finish within" in e for e in errors)
    assert len(errors) == 2  # each failure recorded once on the plugin
    assert await PlannerCycle.objects.filter(session=session, action="reply").acount() == 2


def test_built_in_handlers_run_in_order_which_order_change_moves_and_abort_stops_the_chain(db):
    calls: list[str] = []

    def handler(name: str, *, answer=None, raises: Exception | None = None):
        async def handle(kwargs, timeout):
            calls.append(name)
            if raises is not None:
                raise raises
            return answer

        return handle

    registered = [
        EventHandler("test:watcher", Point.RECEIVE_AFTER_PROCESS, handler("watcher"), blocking=False, order=0),
        EventHandler("test:first", Point.RECEIVE_AFTER_PROCESS, handler("first"), order=10),
        EventHandler(
            "test:upper",
            Point.RECEIVE_AFTER_PROCESS,
            handler("upper", answer={"modified_kwargs": {"text": "HI", "session": "ignored"}}),
            order=20,
        ),
        EventHandler("test:broken", Point.RECEIVE_AFTER_PROCESS, handler("broken", raises=KeyError("x")), order=30),
    ]
    for h in registered:
        events.register_handler(h)
    try:
        emission = events.emit(Point.RECEIVE_AFTER_PROCESS, text="hi", session="s")
        assert wait_for(lambda: "watcher" in calls)
        assert [c for c in calls if c != "watcher"] == ["first", "upper", "broken"]
        assert emission.kwargs == {"text": "HI", "session": "s"}  # only what the point lets change
        assert not emission.aborted
        assert emission.failures == ["test:broken on chat.receive.after_process: KeyError: 'x'"]

        assert events.order_change("test:broken", 0)
        events.unregister_handler("test:watcher")
        events.unregister_handler("test:broken")
        events.register_handler(
            EventHandler(
                "test:broken",
                Point.RECEIVE_AFTER_PROCESS,
                handler("broken", raises=KeyError("x")),
                order=0,
                error_policy="abort",
            )
        )
        calls.clear()
        emission = events.emit(Point.RECEIVE_AFTER_PROCESS, text="hi")
        assert calls == ["broken"] and emission.aborted and emission.aborted_by == "test:broken"
        assert events.order_change("test:broken", 99) and not events.order_change("test:absent", 1)
        calls.clear()
        events.emit(Point.RECEIVE_AFTER_PROCESS, text="hi")
        assert calls == ["first", "upper", "broken"]

        with pytest.raises(ValueError, match="cannot be aborted"):
            events.register_handler(EventHandler("test:x", Point.AFTER_SEND, handler("x"), error_policy="abort"))
        with pytest.raises(ValueError, match="not a point this host emits"):
            events.register_handler(EventHandler("test:y", "post_llm", handler("y")))
        # A point nobody may abort ignores an abort and says so.
        events.register_handler(EventHandler("test:z", Point.AFTER_SEND, handler("z", answer={"action": "abort"})))
        emission = events.emit(Point.AFTER_SEND)
        assert not emission.aborted and "cannot be aborted" in emission.failures[0]
    finally:
        for name in ("test:watcher", "test:first", "test:upper", "test:broken", "test:z"):
            events.unregister_handler(name)


def test_plugins_call_each_others_apis_by_full_or_unique_name_public_only(load_plugins):
    host = load_plugins("events", "api_caller")
    caller, owner = host.records[CALLER], host.records[EVENTS]

    def call(plugin_id, name, args=None, caller=caller, version=""):
        return asyncio.run(call_api(caller, plugin_id, name, args or {}, 5.0, version=version))

    assert call("", "add", {"a": 2, "b": 3}) == {"sum": 5, "version": 2}  # unique short name, newest version
    assert call("", "test.maibot.events.add", {"a": 1, "b": 1}, version="2")["sum"] == 2
    with pytest.raises(PluginApiError, match=r"no API test\.maibot\.events\.add version 1 is loaded"):
        call(EVENTS, "add", version="1")
    several = r"offered by several plugins \(test\.maibot\.api-caller, test\.maibot\.events\)"
    with pytest.raises(PluginApiError, match=several):
        call("", "seen")
    assert call(CALLER, "seen") == "mine"
    with pytest.raises(PluginApiError, match="is not public: only its own plugin may call it"):
        call(EVENTS, "private_counter")
    assert call(EVENTS, "private_counter", caller=owner) == 0
    with pytest.raises(ValueError, match="this API is broken"):
        call(CALLER, "broken")
    assert "API broken: ValueError: this API is broken" in caller.recent_errors[-1]
    visible = {a["full_name"] for a in plugin_apis.visible_apis(caller)}
    assert "test.maibot.events.private_counter" not in visible and "test.maibot.events.add" in visible
    assert plugin_apis.describe_api(owner, EVENTS, "private_counter")["public"] is False
    host.stop()
    with pytest.raises(PluginApiError, match="no API"):
        call(CALLER, "seen")


def _call(turn: AgentTurn, name: str, arguments: dict) -> dict:
    request = ToolCallRequest(id=f"call_{name}", name=name, raw_arguments=json.dumps(arguments), arguments=arguments)
    return turn.execute([request])[0].result


def test_a_cacheable_tool_answers_from_its_cache_until_the_ttl_passes(load_plugins, make_session, clock, monkeypatch):
    monkeypatch.setattr(plugin_cache, "clock", clock)
    host = load_plugins("events", "api_caller")
    session = make_session()
    turn = AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test")

    first = _call(turn, "slow_lookup", {"query": "tea"})
    assert first == {"ok": True, "result": {"content": "answer to tea #1"}}
    clock.advance(59)
    again = _call(turn, "slow_lookup", {"query": "tea"})
    assert again == {"ok": True, "result": {"content": "answer to tea #1"}, "cached": True}
    assert _call(turn, "slow_lookup", {"query": "coffee"})["result"]["content"] == "answer to coffee #2"
    clock.advance(2)  # past the 60 s TTL of the first answer
    assert _call(turn, "slow_lookup", {"query": "tea"}) == {"ok": True, "result": {"content": "answer to tea #3"}}
    recorded = [(r.arguments["query"], r.result.get("cached", False)) for r in ToolCallRecord.objects.order_by("id")]
    assert recorded == [("tea", False), ("tea", True), ("coffee", False), ("tea", False)]
    assert asyncio.run(call_api(host.records[EVENTS], EVENTS, "private_counter", {}, 5.0)) == 3  # plugin ran 3 times


def test_cache_declarations_are_bounded():
    assert plugin_cache.policy({}) is None
    assert plugin_cache.policy({"need_cache": True}) == plugin_cache.CachePolicy(ttl=300.0, scope="global")
    assert plugin_cache.policy({"need_cache": True, "cache_ttl": 0}).startswith("cache_ttl must be between 1 and 86400")
    assert plugin_cache.policy({"need_cache": True, "cache_scope": "world"}).startswith("cache_scope must be one of")


def test_a_life_loop_tool_is_offered_to_the_life_loop_and_runs_there(load_plugins, make_session):
    host = load_plugins("events", "api_caller", "weather")
    assert registry.get("diary_note").scopes == frozenset({"chat", LIFE})
    assert LIFE not in registry.get("get_weather").scopes
    turn = AgentTurn.open(kind=CycleKind.LIFE, session=make_session(), trigger="timer", scope=LIFE)
    offered = {t.name for t in turn.tools()}
    assert "diary_note" in offered and "get_weather" not in offered
    assert _call(turn, "diary_note", {"line": "a quiet day"}) == {"ok": True, "result": {"content": "noted"}}
    assert seen(host, "diary") == ["a quiet day"]


def test_after_send_reaches_observers_with_the_sent_message(load_plugins, make_session):
    from chat.outbox import _after_send_kwargs
    from chat.services import message_send

    host = load_plugins("events", "api_caller")
    session = make_session()
    sent = message_send(session=session, source_kind="reply", text="a sent line")
    events.emit_background(Point.AFTER_SEND, lambda: _after_send_kwargs([sent.pk]))
    assert wait_for(lambda: seen(host, "after_send") == ["a sent line"])


async def test_a_hook_stalled_in_five_chats_never_delays_another_chats_planner_and_is_cut_at_tool_timeout(
    fake_llm, runtimes, make_session, tmp_path
):
    """The hook asks for 300 s; the chats it stalls hold no capacity another chat needs (the host once
    waited for hooks in 4 shared threads), and each stalled call is cut at chat.tool_timeout."""
    tool_timeout = 8.0
    host = await sync_to_async(load_ipc_plugins)(tmp_path / "plugins", "slowhook")
    record = host.records[SLOW]
    events.recent_failures.clear()
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "ok"})

    def planned(text: str) -> int:
        return sum(text in json.dumps(r["messages"], ensure_ascii=False) for r in fake_llm.requests)

    async def stalled() -> int:
        return await call_api(record, SLOW, "stalled", {}, 5.0)

    try:
        with config.override(chat={"tool_timeout": tool_timeout}):
            started = time.monotonic()
            for _ in range(5):
                await say(await sync_to_async(make_session)(), "stall please")

            async def four_stalled() -> bool:
                return await stalled() >= 4

            await wait_for_async(four_stalled, what="the hook to stall in the chats")

            said = time.monotonic()
            await say(await sync_to_async(make_session)(), "hello, anyone there?")
            await wait_for_async(
                lambda: planned("hello, anyone there?") == 1, timeout=tool_timeout / 2, what="the other chat's plan"
            )
            assert time.monotonic() - said < tool_timeout / 2
            assert await stalled() == 5  # still waiting meanwhile

            # The stalled chats go on once their hook is cut: at tool_timeout, not the 300 s it asked for.
            await wait_for_async(lambda: planned("stall please") == 5, timeout=tool_timeout + 20, what="the cuts")
            assert tool_timeout <= time.monotonic() - started < tool_timeout + 20
            assert await stalled() == 0  # cancelled in the runner
            cut = f"PluginCallTimeout: did not finish within {tool_timeout:g}s"
            failures = [f.error for f in events.recent_failures if f.handler == f"plugin:{SLOW}:slow_gate"]
            assert failures == [cut] * 5
            assert [e.split(" ", 1)[1] for e in record.recent_errors] == [f"HOOK_HANDLER slow_gate: {cut}"] * 5
            assert record.runner_pid is not None and record.restarts == 0
    finally:
        await sync_to_async(host.stop)()


async def test_one_chat_flooding_slow_observers_leaves_room_for_the_other_chats(monkeypatch):
    monkeypatch.setattr(events, "MAX_BACKLOG", 8)
    monkeypatch.setattr(events, "MAX_BACKLOG_PER_CHAT", 5)
    loop = aio.background_loop()  # where observe handlers run

    async def make_gate() -> asyncio.Event:
        return asyncio.Event()

    gate = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make_gate(), loop))
    seen: list[str] = []

    async def observe(kwargs, timeout):
        if kwargs["session"] == "flood":
            await gate.wait()
        seen.append(kwargs["session"])

    events.recent_failures.clear()
    events.register_handler(EventHandler("test:slow_observer", Point.RECEIVE_AFTER_PROCESS, observe, blocking=False))
    try:
        for _ in range(10):
            await events.aemit(Point.RECEIVE_AFTER_PROCESS, text="spam", session="flood")
        dropped = [f.error for f in events.recent_failures if f.handler == "test:slow_observer"]
        assert dropped == ["dropped: this chat has 5 background handler calls waiting already"] * 5
        await events.aemit(Point.RECEIVE_AFTER_PROCESS, text="hi", session="quiet")

        async def quiet_seen() -> bool:
            return seen == ["quiet"]

        await wait_for_async(quiet_seen, what="the other chat's observer")
        loop.call_soon_threadsafe(gate.set)

        async def all_seen() -> bool:
            return seen.count("flood") == 5 and events._backlog == {}  # every slot given back

        await wait_for_async(all_seen, what="the flood's observers")
    finally:
        events.unregister_handler("test:slow_observer")
