"""A test plugin written against the real maibot-plugin-sdk: a tool, a command and an API that wait an
hour (without blocking their runner's loop), as a plugin stuck on a slow service would, and a tool that
blocks its runner with time.sleep, as a hostile one would. `relay` calls the slow API through the host
(as another plugin would), `recent` reads the chat through a capability. Its `stalled` API tells how
many calls wait now."""

import asyncio
import time

from maibot_sdk import API, Command, MaiBotPlugin, Tool
from maibot_sdk.types import ToolParameterInfo, ToolParamType


class SlowToolPlugin(MaiBotPlugin):
    def __init__(self) -> None:
        super().__init__()
        self.stalled = 0

    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    async def _stall(self) -> None:
        self.stalled += 1
        try:
            await asyncio.sleep(3600)
        finally:
            self.stalled -= 1

    @Tool(
        "slow_lookup",
        description="Looks a word up",
        parameters=[ToolParameterInfo(name="word", param_type=ToolParamType.STRING, description="word", required=True)],
    )
    async def slow_lookup(self, word: str, **kwargs):
        if word == "freeze":
            time.sleep(3600)  # the whole runner stops: it cannot even take the cancel
        await self._stall()
        return {"content": f"{word}: found"}

    @Tool("relay", description="Asks the slow API")
    async def relay(self, **kwargs):
        answer = await self.ctx.api.call("test.maibot.slowtool.slow_api")
        return {"content": str(answer)}

    @Tool("recent", description="How many messages the chat has lately")
    async def recent(self, stream_id: str = "", **kwargs):
        messages = await self.ctx.message.get_recent(stream_id, limit=5)
        return {"content": f"{len(messages)} recent"}

    @API("slow_api", description="Waits an hour", public=True)
    async def slow_api(self, **kwargs):
        await self._stall()
        return "late"

    @Command("stall", description="Waits an hour", pattern=r"^/stall")
    async def stall(self, **kwargs):
        await self._stall()
        return True, "stalled", True

    @API("stalled", description="How many calls are waiting now", public=True)
    async def api_stalled(self, **kwargs):
        return self.stalled


def create_plugin():
    return SlowToolPlugin()
