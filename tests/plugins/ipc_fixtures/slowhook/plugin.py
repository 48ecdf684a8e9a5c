"""A test plugin written against the real maibot-plugin-sdk: a blocking receive hook that asks for a
300 s timeout and, for a message saying "stall", waits an hour (without blocking its runner's loop),
as a spam filter stuck on a slow service would. Its `stalled` API tells how many calls wait now."""

import asyncio

from maibot_sdk import API, HookHandler, MaiBotPlugin


class SlowHookPlugin(MaiBotPlugin):
    def __init__(self) -> None:
        super().__init__()
        self.stalled = 0

    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    @HookHandler("chat.receive.before_process", name="slow_gate", timeout_ms=300_000)
    async def slow_gate(self, message=None, **kwargs):
        if "stall" in message["processed_plain_text"]:
            self.stalled += 1
            try:
                await asyncio.sleep(3600)
            finally:
                self.stalled -= 1
        return {"action": "continue"}

    @API("stalled", description="How many hook calls are waiting now", public=True)
    async def api_stalled(self, **kwargs):
        return self.stalled


def create_plugin():
    return SlowHookPlugin()
