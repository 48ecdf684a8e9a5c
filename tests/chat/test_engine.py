"""The agent-turn engine: the tools of a scope, and tool calls that never raise (unknown tool, bad
arguments, a failing tool, a timeout) but become error results the model sees, recorded as sent."""

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connections

from chat.agent.engine import AgentTurn, _invoke
from chat.agent.llm import ToolCallRequest
from chat.components import LIFE, Tool, ToolContext, ok, registry
from chat.models import ChatSession, CycleKind, ToolCallRecord
from core import config
from tests.conftest import wait_for, wait_for_async

pytestmark = pytest.mark.django_db

NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.fixture
def release():
    """Set at the end of the test: lets a tool that outlived its timeout return."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def tools(monkeypatch, release):
    def echo(ctx, text: str) -> dict:
        return ok(echo=text, session_id=ctx.session.session_id)

    def boom(ctx) -> dict:
        raise RuntimeError("kaput")

    def not_a_dict(ctx):
        return ["ok"]

    def stuck(ctx) -> dict:
        release.wait(30)
        return ok()

    def count_sessions(ctx) -> dict:
        # Runs in the engine's tool thread on the caller's connection: it sees the caller's transaction.
        release.wait(30)
        return ok(sessions=ChatSession.objects.count())

    made = [
        Tool("echo", "Echo.", {"type": "object", "properties": {"text": {"type": "string"}}}, echo),
        Tool("boom", "Fails.", NO_ARGS, boom),
        Tool("not_a_dict", "Returns a list.", NO_ARGS, not_a_dict),
        Tool("stuck", "Never ends in time.", NO_ARGS, stuck, timeout=0.2),
        Tool("count_sessions", "Counts.", NO_ARGS, count_sessions, timeout=0.2),
        Tool("test_only", "Offered in the test scope.", NO_ARGS, lambda ctx: ok(), scopes=frozenset({"test"})),
    ]
    for tool in made:
        monkeypatch.setitem(registry._tools, tool.name, tool)
    return {t.name: t for t in made}


def call(name, arguments, raw=None, error=""):
    return ToolCallRequest(
        id=f"call_{name}", name=name, raw_arguments=raw or "", arguments=arguments, argument_error=error
    )


def open_turn(session, scope="chat"):
    return AgentTurn.open(kind=CycleKind.CHAT, session=session, trigger="test", scope=scope)


def test_a_scope_offers_only_its_own_tools(make_session, tools):
    session = make_session()
    chat_tools = {t.name for t in open_turn(session).tools()}
    assert {"reply", "no_reply", "echo", "stuck"} <= chat_tools
    assert not chat_tools & {"send_message", "update_inner_state", "do_nothing", "test_only"}
    assert {t.name for t in open_turn(session, scope=LIFE).tools()} == {
        "send_message",
        "update_inner_state",
        "do_nothing",
    }
    assert [s["function"]["name"] for s in open_turn(session, scope="test").schemas()] == ["test_only"]


def test_a_tool_of_another_scope_is_an_unknown_tool(make_session, tools):
    turn = open_turn(make_session(), scope=LIFE)
    (outcome,) = turn.execute([call("echo", {"text": "hi"})])
    assert outcome.code == "unknown_tool" and "send_message" in outcome.result["error"]["message"]
    assert turn.call("reply", {"text": "hi"})["error"]["code"] == "unknown_tool"


def test_calls_that_cannot_run_become_error_results_and_are_recorded(make_session, tools):
    session = make_session()
    turn = open_turn(session)
    outcomes = turn.execute(
        [
            call("echo", {"text": "hi"}, raw='{"text": "hi"}'),
            call("launch_rockets", {"n": 1}),
            call("echo", None, raw='{"text": "oops', error="Unterminated string"),
            call("echo", {"txt": "typo"}),
            call("boom", {}),
            call("not_a_dict", {}),
        ],
        round_no=2,
    )
    assert [o.code if not o.ok else "ok" for o in outcomes] == [
        "ok",
        "unknown_tool",
        "invalid_arguments",
        "invalid_arguments",
        "tool_failed",
        "tool_failed",
    ]
    assert outcomes[0].result == {"ok": True, "echo": "hi", "session_id": session.session_id}
    assert "kaput" in outcomes[4].result["error"]["message"]
    records = list(ToolCallRecord.objects.filter(cycle=turn.cycle).order_by("id"))
    assert [(r.name, r.ok, r.round) for r in records] == [
        ("echo", True, 2),
        ("launch_rockets", False, 2),
        ("echo", False, 2),
        ("echo", False, 2),
        ("boom", False, 2),
        ("not_a_dict", False, 2),
    ]
    assert [r.result for r in records] == [o.result for o in outcomes]  # recorded exactly as the model is told
    assert records[2].raw_arguments == '{"text": "oops' and records[2].arguments == {}
    assert [m["tool_call_id"] for m in (o.message() for o in outcomes)][:2] == ["call_echo", "call_launch_rockets"]


def test_a_tool_past_its_timeout_becomes_an_error_result_and_is_recorded(make_session, tools):
    turn = open_turn(make_session())
    (outcome,) = turn.execute([call("stuck", {})])
    assert not outcome.ok and outcome.code == "tool_timeout" and "0.2s" in outcome.result["error"]["message"]
    record = ToolCallRecord.objects.get(cycle=turn.cycle)
    assert not record.ok and record.result["error"]["code"] == "tool_timeout"


def test_the_default_tool_timeout_comes_from_the_config(make_session, tools, monkeypatch):
    monkeypatch.setattr(tools["stuck"], "timeout", None)
    with config.override(chat={"tool_timeout": 0.1}):
        result = open_turn(make_session()).call("stuck", {})
    assert result["error"]["code"] == "tool_timeout" and "0.1s" in result["error"]["message"]


def test_a_tool_runs_on_the_callers_connection(make_session, tools, release):
    turn = open_turn(make_session())
    release.set()
    assert turn.call("count_sessions", {}) == {"ok": True, "sessions": 1}  # the test's own transaction


@pytest.mark.django_db(transaction=True)
def test_after_a_timeout_the_turn_goes_on_with_a_fresh_connection(make_session, tools, release):
    turn = open_turn(make_session())
    lent = connections["default"]
    (outcome,) = turn.execute([call("count_sessions", {})])
    assert outcome.code == "tool_timeout"
    assert connections["default"] is not lent  # the record was written on a fresh connection
    assert ToolCallRecord.objects.get(cycle=turn.cycle).result["error"]["code"] == "tool_timeout"
    release.set()
    # The late tool finishes on the lent connection, then closes it.
    assert wait_for(lambda: lent.connection is None, timeout=10)


async def test_a_tool_thread_runs_coroutines_on_the_callers_event_loop():
    # As the send service's wake-up does with Redis: async_to_sync from a tool run by the planner goes
    # to the server's loop, as it would from the planner's own thread, not to a new loop per call.
    seen = []

    async def where():
        seen.append(asyncio.get_running_loop())

    tool = Tool("where", "", NO_ARGS, lambda ctx: async_to_sync(where)() or ok())
    assert await sync_to_async(_invoke)(tool, ToolContext(session=None), {}, 5) == {"ok": True}
    assert seen == [asyncio.get_running_loop()]


@pytest.fixture
def async_tools(monkeypatch):
    """Sync and async tools that note when they run; `gate` lets `waits` answer."""
    order: list[str] = []
    gate = asyncio.Event()

    def noted(ctx, text: str) -> dict:
        order.append(f"sync {text}")
        return ok(text=text)

    async def waits(ctx, text: str) -> dict:
        order.append(f"async {text}")
        await gate.wait()
        return ok(text=text)

    async def sleeps(ctx) -> dict:
        order.append("sleeps")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            order.append("sleeps cancelled")
            raise

    async def broken(ctx) -> dict:
        raise RuntimeError("kaput")

    async def not_a_dict(ctx):
        return ["ok"]

    text = {"type": "object", "properties": {"text": {"type": "string"}}}
    made = [
        Tool("noted", "Sync.", text, noted),
        Tool("waits", "Async, until the gate opens.", text, waits),
        Tool("sleeps", "Async, an hour.", NO_ARGS, sleeps, timeout=0.3),
        Tool("abroken", "Async, fails.", NO_ARGS, broken),
        Tool("anot_a_dict", "Async, returns a list.", NO_ARGS, not_a_dict),
    ]
    for tool in made:
        monkeypatch.setitem(registry._tools, tool.name, tool)
    return order, gate


def started(order: list[str]):
    async def check() -> bool:
        return order == ["sync 1", "async 2"]

    return check


@pytest.mark.django_db(transaction=True)
async def test_aexecute_awaits_async_tools_in_order_without_holding_the_db_thread(make_session, async_tools):
    order, gate = async_tools
    turn = await sync_to_async(open_turn)(await sync_to_async(make_session)())
    task = asyncio.ensure_future(
        turn.aexecute(
            [
                call("noted", {"text": "1"}),
                call("waits", {"text": "2"}),
                call("noted", {"text": "3"}),
                call("sleeps", {}),
                call("abroken", {}),
                call("anot_a_dict", {}),
                call("waits", {"txt": "typo"}),
            ],
            round_no=1,
        )
    )
    await wait_for_async(started(order), what="the async tool to start")
    # While the async tool waits, the thread every runtime's database work runs in is free.
    assert await asyncio.wait_for(sync_to_async(ChatSession.objects.count)(), 5) == 1
    assert not task.done()
    gate.set()
    outcomes = await task
    assert order == ["sync 1", "async 2", "sync 3", "sleeps", "sleeps cancelled"]
    assert [o.code if not o.ok else "ok" for o in outcomes] == [
        "ok",
        "ok",
        "ok",
        "tool_timeout",
        "tool_failed",
        "tool_failed",
        "invalid_arguments",
    ]
    assert outcomes[1].result == {"ok": True, "text": "2"}
    assert outcomes[3].result["error"]["message"] == "sleeps did not finish within 0.3s"
    assert outcomes[4].result["error"]["message"] == "RuntimeError: kaput"
    assert outcomes[5].result["error"]["message"] == "TypeError: tool returned list, not a dict"
    records = [r async for r in ToolCallRecord.objects.filter(cycle=turn.cycle).order_by("id")]
    assert [(r.name, r.round, r.result) for r in records] == [(o.name, 1, o.result) for o in outcomes]


@pytest.mark.django_db(transaction=True)
async def test_aexecute_stopped_during_an_async_tool_records_the_calls_that_ran(make_session, async_tools):
    order, _gate = async_tools
    turn = await sync_to_async(open_turn)(await sync_to_async(make_session)())
    task = asyncio.ensure_future(turn.aexecute([call("noted", {"text": "1"}), call("waits", {"text": "2"})]))
    await wait_for_async(started(order), what="the async tool to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    records = [r async for r in ToolCallRecord.objects.filter(cycle=turn.cycle)]
    assert [(r.name, r.result) for r in records] == [("noted", {"ok": True, "text": "1"})]


def test_an_async_tool_called_from_sync_code_is_cut_at_its_timeout(make_session, async_tools):
    order, _gate = async_tools
    turn = open_turn(make_session())
    assert turn.call("sleeps", {})["error"] == {"code": "tool_timeout", "message": "sleeps did not finish within 0.3s"}
    # The stalled coroutine is cancelled at its deadline: it keeps no thread of the engine's pool.
    assert wait_for(lambda: order == ["sleeps", "sleeps cancelled"])
    assert turn.call("abroken", {})["error"]["message"] == "RuntimeError: kaput"
    assert turn.call("noted", {"text": "1"}) == {"ok": True, "text": "1"}
    assert ToolCallRecord.objects.filter(cycle=turn.cycle).count() == 3
