"""End to end through a live server and the real maim_message client: a user's messages of 70,000 and
1,000,000 characters reach a plugin's hook and command whole (the plugin says their SHA-256 in the
chat); a plugin folder put into a server started without a plugins folder loads, its command answers,
and once the folder is removed the command no longer answers and its runner process is gone."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import time
import uuid

import pytest

from tests.conftest import wait_for_async
from tests.fake_llm import FakeLLM
from tests.plugins.conftest import FIXTURES, IPC_FIXTURES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live, pytest.mark.backend_independent]

TOKEN = "ipc-token"


def texts_of(frame: dict) -> list[str]:
    return [s["data"] for s in frame["message_segment"]["data"] if s["type"] == "text"]


class Adapter:
    """A QQ adapter (maim_message's Router) connected to the server: says things as one user and
    collects what the bot sends."""

    def __init__(self, base: str) -> None:
        from maim_message import RouteConfig, Router, TargetConfig

        url = base.replace("http://", "ws://") + "/ws"
        self.router = Router(RouteConfig(route_config={"qq": TargetConfig(url=url, token=TOKEN)}))
        self.received: asyncio.Queue = asyncio.Queue()
        self.router.register_class_handler(self._on_message)
        self.task: asyncio.Task | None = None

    async def _on_message(self, message: dict) -> None:
        await self.received.put(message)

    async def __aenter__(self) -> Adapter:
        self.task = asyncio.create_task(self.router.run())

        async def connected() -> bool:
            return self.router.check_connection("qq")

        await wait_for_async(connected, what="the adapter to connect")
        return self

    async def __aexit__(self, *exc) -> None:
        await self.router.stop()
        self.task.cancel()

    async def say(self, text: str) -> None:
        from maim_message import BaseMessageInfo, FormatInfo, MessageBase, Seg, UserInfo

        info = BaseMessageInfo(
            platform="qq",
            message_id=uuid.uuid4().int % 10**9,
            time=time.time(),
            user_info=UserInfo(platform="qq", user_id=10001, user_nickname="Alice", user_cardname=""),
            format_info=FormatInfo(content_format=["text"], accept_format=["text", "reply", "emoji"]),
            additional_config={},
        )
        segment = Seg("seglist", [Seg("text", text)])
        await self.router.send_message(MessageBase(message_info=info, message_segment=segment, raw_message=text))

    async def reply(self, timeout: float = 60) -> list[str]:
        return texts_of(await asyncio.wait_for(self.received.get(), timeout=timeout))


async def test_messages_of_70_000_and_1_000_000_characters_reach_a_plugin_whole_through_a_live_server(
    start_server, tmp_path
):
    shutil.copytree(IPC_FIXTURES / "bigframes", tmp_path / "data-web" / "plugins" / "bigframes")
    with FakeLLM() as fake:
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=TOKEN
        )
        async with Adapter(base) as adapter:
            await asyncio.to_thread(proc.wait_for_output, "plugins loaded: 1 of 1", 60)
            pid = re.search(r"bigframes 1\.0\.0 loaded \(runner pid (\d+)\)", proc.output()).group(1)
            for size in (70_000, 1_000_000):
                unit = "长消息 long message 🧩 "
                body = (unit * (size // len(unit) + 1))[: size - 1] + "!"
                await adapter.say("/fingerprint " + body)
                digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
                assert await adapter.reply() == [f"fingerprint {size} {digest}"]
            assert fake.requests == []  # the command intercepted both
            log = proc.output()
            assert "runner pid" in log and "exited" not in log and "restarting" not in log
            assert f"runner pid {pid}" in log and log.count("loaded (runner pid") == 1


async def test_a_plugin_folder_put_in_loads_and_removed_unloads_within_seconds(start_server, tmp_path):
    data = tmp_path / "data-web"
    with FakeLLM() as fake:
        fake.default = lambda body: fake.tool_call("reply", {"text": "Nobody greets here any more."})
        proc, base = start_server(
            OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model", MAIBOT_ADAPTER_TOKENS=TOKEN
        )
        async with Adapter(base) as adapter:
            # The server made the folder when its plugin host started (as soon as daphne ran), and watches it.
            await asyncio.to_thread(proc.wait_for_output, "plugins loaded: 0 of 0", 60)
            # The watcher starts after the load: a folder copied in before it watches is not seen.
            await asyncio.to_thread(proc.wait_for_output, "for changes to plugins", 60)
            assert (data / "plugins").is_dir()
            shutil.copytree(FIXTURES / "weather", data / "plugins" / "weather")
            await asyncio.to_thread(proc.wait_for_output, "plugin test.maibot.weather 1.2.0 loaded (runner pid", 60)
            pid = int(re.search(r"weather 1\.2\.0 loaded \(runner pid (\d+)\)", proc.output()).group(1))
            await adapter.say("/hello Bob")
            assert await adapter.reply() == ["Hi, Bob!"]

            removed = time.monotonic()
            shutil.rmtree(data / "plugins" / "weather")
            await asyncio.to_thread(proc.wait_for_output, "test.maibot.weather: unloaded (its folder was removed)", 20)

            async def runner_gone() -> bool:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True
                return False

            await wait_for_async(runner_gone, timeout=15, what="the removed plugin's runner to exit")
            assert time.monotonic() - removed < 20
            await adapter.say("/hello Bob")
            assert await adapter.reply() == ["Nobody greets here any more."]  # the planner's, not the plugin's
            assert "/hello Bob" in str(fake.requests[-1]["messages"])
