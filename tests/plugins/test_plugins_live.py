"""End to end with example plugins in the data dir: the real maim_message client → live daphne (which
loads the plugins, the broken ones refused with their reasons) → the planner offers the plugin's tool
to the real openai client talking to FakeLLM → the tool runs in the plugin, is recorded, its result
goes back to the model → the reply reaches the adapter; a plugin command answers without any model
call; the bot keeps answering whatever the broken plugins did, and when a plugin exits its runner
process in the middle of a planner cycle."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from chat.models import LLMCall, PlannerCycle, ToolCallRecord
from tests.conftest import wait_for_async
from tests.fake_llm import FakeLLM
from tests.plugins.conftest import copy_plugins

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.backend_independent]

TOKEN = "plugins-token"

# The fixture plugins this test copies into the server's data dir (folder → plugin id, the state it must
# end in), named here rather than "every fixture": a fixture plugin added for another test changes neither
# what this server loads nor what this test expects of it.
PLUGINS = {
    "weather": ("test.maibot.weather", "loaded"),
    "needs_weather": ("test.maibot.needs-weather", "loaded"),  # after the plugin it depends on
    "events": ("test.maibot.events", "loaded"),
    "unruly": ("test.maibot.unruly", "loaded"),
    "api_caller": ("test.maibot.api-caller", "loaded"),
    "broken_host": ("test.maibot.future", "refused"),
    "needs_package": ("test.maibot.needs-package", "refused"),
    "needs_missing_plugin": ("test.maibot.needs-plugin", "refused"),
    "cycle_a": ("test.maibot.cycle-a", "refused"),
    "cycle_b": ("test.maibot.cycle-b", "refused"),
    "raises_on_import": ("test.maibot.raises", "failed"),
}


async def db(fn):
    def run():
        try:
            return fn()
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()


def texts_of(frame: dict) -> list[str]:
    return [s["data"] for s in frame["message_segment"]["data"] if s["type"] == "text"]


async def test_plugin_tool_and_command_through_a_live_server_while_broken_plugins_are_refused(start_server, tmp_path):
    from maim_message import BaseMessageInfo, FormatInfo, MessageBase, RouteConfig, Router, Seg, TargetConfig, UserInfo

    copy_plugins(tmp_path / "data-web" / "plugins", *PLUGINS)
    with FakeLLM() as fake:
        fake.script(
            fake.tool_call("get_weather", {"city": "Paris"}),
            fake.tool_call("reply", {"text": "Light rain in Paris today."}),
            fake.tool_call("unruly_crash", {}),
            fake.tool_call("reply", {"text": "Still here."}),
        )
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=TOKEN
        )
        url = base.replace("http://", "ws://") + "/ws"
        router = Router(RouteConfig(route_config={"qq": TargetConfig(url=url, token=TOKEN)}))
        received: asyncio.Queue = asyncio.Queue()

        async def on_message(message: dict) -> None:
            await received.put(message)

        router.register_class_handler(on_message)
        task = asyncio.create_task(router.run())
        try:

            async def connected() -> bool:
                return router.check_connection("qq")

            await wait_for_async(connected, what="the adapter to connect")
            await asyncio.to_thread(proc.wait_for_output, "plugins loaded: ", 60)
            log = proc.output()
            loaded, total, states = re.search(r"plugins loaded: (\d+) of (\d+) \((.*)\)", log).groups()
            assert dict(pair.split("=") for pair in states.split(", ")) == dict(PLUGINS.values())
            expected_loaded = sum(state == "loaded" for _, state in PLUGINS.values())
            assert (int(loaded), int(total)) == (expected_loaded, len(PLUGINS))
            assert "refused: dependency cycle: test.maibot.cycle-a -> test.maibot.cycle-b -> test.maibot.cycle-a" in log
            assert "failed: ImportError: this plugin needs a module that is not there" in log
            assert "refused: host_application needs MaiBot >= 2.0.0" in log

            async def say(text: str) -> None:
                info = BaseMessageInfo(
                    platform="qq",
                    message_id=uuid.uuid4().int % 10**9,
                    time=time.time(),
                    user_info=UserInfo(platform="qq", user_id=10001, user_nickname="Alice", user_cardname=""),
                    format_info=FormatInfo(content_format=["text"], accept_format=["text", "reply", "emoji"]),
                    additional_config={},
                )
                segment = Seg("seglist", [Seg("text", text)])
                await router.send_message(MessageBase(message_info=info, message_segment=segment, raw_message=text))

            await say("what's the weather in Paris?")
            frame = await asyncio.wait_for(received.get(), timeout=30)
            assert texts_of(frame) == ["Light rain in Paris today."]
            assert len(fake.requests) == 2
            offered = [t["function"]["name"] for t in fake.requests[0]["tools"]]
            assert "get_weather" in offered and "wave" in offered
            tool_message = fake.requests[1]["messages"][-1]
            assert tool_message["role"] == "tool" and "麦麦: light rain, 14°C" in tool_message["content"]
            record = await wait_for_async(
                lambda: ToolCallRecord.objects.filter(name="get_weather").first(), what="the tool call recorded"
            )
            assert record.ok and record.arguments == {"city": "Paris"}
            assert record.result["result"]["content"] == "麦麦: light rain, 14°C"

            # The example events plugin saw the process start and the reply handed to the adapter.
            await asyncio.to_thread(proc.wait_for_output, "saw after_send: Light rain in Paris today.", 30)
            assert "saw on_start: True" in proc.output()
            assert fake.requests[0]["messages"][-1] == {
                "role": "system",
                "content": "plugin note: the user likes haiku",
            }  # its maisaka.planner.before_request hook

            await say("/hello Bob")
            frame = await asyncio.wait_for(received.get(), timeout=30)
            assert texts_of(frame) == ["Hi, Bob!"]
            cycle = await wait_for_async(
                lambda: PlannerCycle.objects.filter(action="command", ended_at__isnull=False).first(),
                what="the command's cycle closed",
            )
            assert "plugin command test.maibot.weather.hello: ok (greeted Bob)" in cycle.outcome
            # The command intercepted: the model was never asked about "/hello Bob".
            assert len(fake.requests) == 2
            assert await db(lambda: LLMCall.objects.count()) == 2
            assert proc.popen.poll() is None

            # A plugin that exits its runner process: the cycle gets an error tool result and goes on,
            # the bot answers, the runner is restarted.
            await say("please crash")
            frame = await asyncio.wait_for(received.get(), timeout=30)
            assert texts_of(frame) == ["Still here."]
            crashed = fake.requests[3]["messages"][-1]
            assert crashed["role"] == "tool" and "exited (code 3)" in crashed["content"]
            await asyncio.to_thread(proc.wait_for_output, "plugin test.maibot.unruly: runner restarted", 60)
            assert "test.maibot.unruly: its runner (pid" in proc.output()
            assert proc.popen.poll() is None
        finally:
            await router.stop()
            task.cancel()
        # SIGTERM: the plugins' on_unload runs before daphne's loop goes away.
        await asyncio.to_thread(proc.stop)
        assert f"plugins unloaded ({expected_loaded})" in proc.output()
