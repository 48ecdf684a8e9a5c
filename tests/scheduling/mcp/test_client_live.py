"""The bot as an MCP client: a server written with the SDK (tests/scheduling/mcp/tool_server.py) over stdio and over
streamable HTTP, its tools offered to the planner of a live daphne through the real openai client and
the scripted LLM server, called and recorded; killed mid-call, restarted, reconfigured."""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chat.models import PlannerCycle, ToolCallRecord
from scheduling.life.timers import timer_create
from scheduling.mcp.models import McpServerState
from scheduling.services import SYSTEM
from tests.chat.gateway_helpers import Adapter06, envelope, write_bot_config
from tests.conftest import Proc, db, free_port, wait_for, wait_for_async
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

TOKEN = "mcp-client-token"
SERVER = Path(__file__).resolve().parent / "tool_server.py"


def config(*servers: str) -> str:
    return "\n".join(['[llm]\nmodel = "fake-model"\n', *servers])


def stdio_entry(marker: Path, tools: str = '["add", "slow", "fail"]') -> str:
    return (
        f'[[mcp.servers]]\nname = "calc"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = [{json.dumps(str(SERVER))}, "stdio"]\nenv = {{MCP_TEST_MARKER = {json.dumps(str(marker))}}}\n'
        f"tools = {tools}\ncall_timeout_seconds = 20\n"
    )


def poke(base: str) -> None:
    """The server starts its MCP links when it first serves."""
    try:
        urllib.request.urlopen(f"{base}/healthz", timeout=10).read()
    except urllib.error.HTTPError:  # 503 without a cluster: served all the same
        pass


async def ready(name: str, after=None) -> McpServerState:
    def check():
        state = McpServerState.objects.filter(name=name, state="ready").first()
        return state if state and (after is None or state.connected_at > after) else None

    return await wait_for_async(check, timeout=30, what=f"MCP server {name} ready")


def marks(marker: Path) -> list[list[str]]:
    return [line.split() for line in marker.read_text().splitlines()] if marker.exists() else []


async def record(name: str) -> ToolCallRecord:
    return await wait_for_async(
        lambda: ToolCallRecord.objects.filter(name=name).order_by("-id").first(), what=f"{name} recorded"
    )


@pytest.mark.long
@pytest.mark.backend_independent
async def test_stdio_server_tools_are_called_recorded_and_survive_a_kill(start_server, tmp_path):
    marker = tmp_path / "calls.txt"
    write_bot_config(tmp_path / "data-web", config(stdio_entry(marker)))
    with FakeLLM() as fake:
        _, base = start_server("web", OPENAI_BASE_URL=fake.base_url, MAIBOT_ADAPTER_TOKENS=TOKEN)
        poke(base)
        state = await ready("calc")
        assert sorted(state.tools) == ["calc__add", "calc__fail", "calc__slow"]
        adapter = await Adapter06(base, token=TOKEN).start()
        try:
            # 1. The model calls the server's tool; its result goes back to the model, which replies.
            fake.script(fake.tool_call("calc__add", {"a": 2, "b": 3}), fake.tool_call("reply", {"text": "是 5"}))
            await adapter.send(envelope(user_id=10001, text="2+3?"))
            frame = await adapter.next_message(timeout=30)
            assert frame["message_segment"]["data"][0]["data"] == "是 5"
            offered = {t["function"]["name"] for t in fake.requests[0]["tools"]}
            assert {"calc__add", "calc__slow", "calc__fail"} <= offered and "calc__shout" not in offered
            added = await record("calc__add")
            assert (added.ok, added.arguments, added.result) == (
                True,
                {"a": 2, "b": 3},
                {"ok": True, "result": {"result": 5}},
            )
            tool_message = [m for m in fake.requests[1]["messages"] if m["role"] == "tool"]
            assert json.loads(tool_message[-1]["content"]) == {"ok": True, "result": {"result": 5}}

            # 2. Arguments that do not fit the server's schema never reach it; a tool error comes back as ours.
            fake.script(
                fake.tool_calls(("calc__add", {"a": "two", "b": 3}), ("calc__fail", {"reason": "坏了 broken"})),
                fake.tool_call("reply", {"text": "oops"}),
            )
            await adapter.send(envelope(user_id=10001, text="again"))
            assert (await adapter.next_message(timeout=30))["message_segment"]["data"][0]["data"] == "oops"
            refused = await db(lambda: ToolCallRecord.objects.filter(name="calc__add").order_by("-id").first())
            assert refused.result["error"]["code"] == "invalid_arguments" and "a:" in refused.result["error"]["message"]
            failed = await record("calc__fail")
            assert (
                failed.result["error"]["code"] == "mcp_tool_error"
                and "坏了 broken" in failed.result["error"]["message"]
            )
            assert [m[0] for m in marks(marker)] == ["add"]

            # 3. The server dies mid-call: the call fails at once, the cycle records it, the bot answers.
            fake.script(fake.tool_call("calc__slow", {"seconds": 60}), fake.tool_call("reply", {"text": "服务器挂了"}))
            await adapter.send(envelope(user_id=10001, text="slow please"))
            assert wait_for(lambda: any(m[0] == "slow" for m in marks(marker)), timeout=30)
            pid = int(next(m[1] for m in marks(marker) if m[0] == "slow"))
            before = state.connected_at
            os.kill(pid, signal.SIGKILL)
            assert (await adapter.next_message(timeout=30))["message_segment"]["data"][0]["data"] == "服务器挂了"
            slow = await record("calc__slow")
            assert (slow.ok, slow.result["error"]["code"]) == (False, "mcp_unavailable"), slow.result
            # The reply goes out before the cycle's own record is finished: wait for its end.
            cycle = await wait_for_async(
                lambda: PlannerCycle.objects.filter(pk=slow.cycle_id, ended_at__isnull=False).first(),
                what="the cycle recorded",
            )
            assert cycle.action == "reply" and not cycle.error

            # 4. It is started again and its tools come back.
            state = await ready("calc", after=before)
            assert "calc__add" in state.tools and state.last_error
            fake.script(fake.tool_call("calc__add", {"a": 40, "b": 2}), fake.tool_call("reply", {"text": "42"}))
            await adapter.send(envelope(user_id=10001, text="40+2?"))
            assert (await adapter.next_message(timeout=30))["message_segment"]["data"][0]["data"] == "42"
            assert [m[0] for m in marks(marker)][-1] == "add" and marks(marker)[-1][1] != str(pid)
        finally:
            await adapter.stop()


@pytest.mark.backend_independent
async def test_http_server_with_headers_and_hot_reload(start_server, tmp_path, monkeypatch):
    # A header's secret comes from the environment, by a name the deployment allows (the server
    # process inherits both variables).
    monkeypatch.setenv("MAIBOT_MCP_SECRET_ENVS", "MCP_TEST_SECRET")
    monkeypatch.setenv("MCP_TEST_SECRET", "from-env")
    port = free_port()
    tools = Proc([sys.executable, str(SERVER), "http", str(port)], dict(os.environ), tmp_path / "tools.log")
    try:
        tools.wait_for_output("Uvicorn running", timeout=30)
        entry = (
            f'[[mcp.servers]]\nname = "web_tools"\nurl = "http://127.0.0.1:{port}/mcp"\n'
            'headers = {X-Test = "${MCP_TEST_SECRET}"}\ntools = ["shout"]\n'
        )
        write_bot_config(tmp_path / "data-web", config(entry))
        with FakeLLM() as fake:
            _, base = start_server("web", OPENAI_BASE_URL=fake.base_url, MAIBOT_ADAPTER_TOKENS=TOKEN)
            poke(base)
            state = await ready("web_tools")
            assert state.tools == ["web_tools__shout"] and state.transport == "http"
            adapter = await Adapter06(base, token=TOKEN).start()
            try:
                fake.script(fake.tool_call("web_tools__shout", {"text": "hi"}), fake.tool_call("reply", {"text": "ok"}))
                await adapter.send(envelope(user_id=10001, text="shout"))
                assert (await adapter.next_message(timeout=30))["message_segment"]["data"][0]["data"] == "ok"
                shout = await record("web_tools__shout")
                assert shout.result == {"ok": True, "result": {"result": "HI [from-env]"}}
                counted = await db(lambda: McpServerState.objects.get(name="web_tools"))
                assert (counted.calls, counted.failed_calls) == (1, 0) and counted.mean_call_ms > 0

                # The server taken out of the config: its tools are withdrawn without a restart.
                write_bot_config(tmp_path / "data-web", config())
                await wait_for_async(
                    lambda: McpServerState.objects.filter(name="web_tools", state="stopped").exists(),
                    timeout=30,
                    what="the link stopped",
                )
                fake.script(fake.tool_call("reply", {"text": "plain"}))
                await adapter.send(envelope(user_id=10001, text="again"))
                assert (await adapter.next_message(timeout=30))["message_segment"]["data"][0]["data"] == "plain"
                assert "web_tools__shout" not in {t["function"]["name"] for t in fake.requests[-1]["tools"]}
            finally:
                await adapter.stop()
    finally:
        tools.stop()


def test_life_loop_turns_in_a_cluster_worker_are_offered_the_servers_tools(make_session, start_qcluster, tmp_path):
    marker = tmp_path / "calls.txt"
    entry = stdio_entry(marker, tools='["add"]') + 'scopes = ["life"]\n'
    write_bot_config(tmp_path / "data-q1", config(entry))
    with FakeLLM() as fake:
        fake.script(fake.tool_call("calc__add", {"a": 1, "b": 2}))
        start_qcluster(OPENAI_BASE_URL=fake.base_url)
        session = make_session()
        timer_create(spec="1s", label="count", payload="add things", session=session, acted_by=SYSTEM)
        assert wait_for(lambda: ToolCallRecord.objects.filter(name="calc__add").exists(), timeout=60)
        offered = {t["function"]["name"] for t in fake.requests[0]["tools"]}
        assert "calc__add" in offered and "calc__slow" not in offered and "send_message" in offered
    record = ToolCallRecord.objects.get(name="calc__add")
    assert (record.ok, record.result) == (True, {"ok": True, "result": {"result": 3}})
    assert record.cycle.kind == "life"
    state = McpServerState.objects.get(name="calc")
    assert state.state == "ready" and state.tools == ["calc__add"] and state.calls == 1
    assert [m[0] for m in marks(marker)] == ["add"]
