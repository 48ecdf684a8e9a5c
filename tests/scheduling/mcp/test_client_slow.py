"""An MCP server's tool that never answers (tests/scheduling/mcp/tool_server.py over stdio, the real mcp client
in-process), called by the planner of several chats at once through chat's real session runtime and
FakeLLM: another chat's planner call and reply come at once, and each stalled call is cut at the
server's call_timeout_seconds with the error result the model sees, recorded."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from chat.models import Direction, Message, ToolCallRecord
from core.config import parse_config
from scheduling.mcp.client import ServerLink
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

SERVER = Path(__file__).resolve().parent / "tool_server.py"
CALL_TIMEOUT = 8.0
CHATS = 3


def answered(session, text: str) -> int:
    return Message.objects.filter(session=session, direction=Direction.OUT, text=text).count()


async def test_a_slow_mcp_tool_in_three_chats_never_delays_another_chats_planner_and_is_cut_at_its_timeout(
    fake_llm, runtimes, make_session, tmp_path
):
    marker = tmp_path / "calls.txt"
    entry = parse_config(
        f'[[mcp.servers]]\nname = "calc"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{MCP_TEST_MARKER = {json.dumps(str(marker))}}}\n'
        f'tools = ["slow"]\ncall_timeout_seconds = {CALL_TIMEOUT}\n'
    ).mcp.servers[0]

    def answer(body):
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return fake_llm.tool_call("reply", {"text": "the server answered"})
        if "please be slow" in json.dumps(messages, ensure_ascii=False):
            return fake_llm.tool_call("calc__slow", {"seconds": 3600})
        return fake_llm.tool_call("reply", {"text": "hi"})

    fake_llm.default = answer
    link = ServerLink(entry, asyncio.get_running_loop())
    try:

        async def connected() -> bool:
            return "calc__slow" in link.offered

        await wait_for_async(connected, timeout=30, what="the MCP server's tools")
        started = time.monotonic()
        sessions = [await sync_to_async(make_session)() for _ in range(CHATS)]
        for session in sessions:
            await say(session, "please be slow")

        async def all_stalled() -> bool:
            lines = marker.read_text().splitlines() if marker.exists() else []
            return sum(line.startswith("slow ") for line in lines) == CHATS

        await wait_for_async(all_stalled, timeout=CALL_TIMEOUT - 2, what="a call stalled in every chat at once")

        said = time.monotonic()
        other = await sync_to_async(make_session)()
        await say(other, "hello, anyone there?")
        await wait_for_async(lambda: answered(other, "hi") == 1, timeout=CALL_TIMEOUT / 2, what="the other chat")
        assert time.monotonic() - said < CALL_TIMEOUT / 2
        assert await ToolCallRecord.objects.filter(name="calc__slow").acount() == 0  # still waiting meanwhile

        await wait_for_async(
            lambda: sum(answered(s, "the server answered") for s in sessions) == CHATS,
            timeout=CALL_TIMEOUT + 20,
            what="the cuts",
        )
        assert CALL_TIMEOUT <= time.monotonic() - started < CALL_TIMEOUT + 20
    finally:
        await link.stop()
    timeout_result = {
        "ok": False,
        "error": {"code": "tool_timeout", "message": f"calc__slow did not finish within {CALL_TIMEOUT:g}s"},
    }
    records = [r async for r in ToolCallRecord.objects.filter(name="calc__slow")]
    assert [(r.ok, r.result) for r in records] == [(False, timeout_result)] * CHATS
    told = [json.loads(r["messages"][-1]["content"]) for r in fake_llm.requests if r["messages"][-1]["role"] == "tool"]
    assert told == [timeout_result] * CHATS
