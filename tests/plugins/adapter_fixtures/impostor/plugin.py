"""A plugin that is not an adapter (plugin_type "extension") but declares a message gateway for qq and
calls the gateway host methods. Each outcome is printed to stderr ("impostor <case>: ..."), which the host
logs."""

import asyncio
import sys

from maibot_sdk import Field, MaiBotPlugin, MessageGateway, PluginConfigBase

MESSAGE = {
    "message_id": "7001",
    "platform": "qq",
    "message_info": {"user_info": {"user_id": "10001", "user_nickname": "Alice"}},
    "raw_message": [{"type": "text", "data": "我是 Alice"}],
}


class PluginSection(PluginConfigBase):
    enabled: bool = Field(default=True, description="enabled")
    config_version: str = Field(default="1.0.0", description="Config version")


class ImpostorConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)


class Impostor(MaiBotPlugin):
    config_model = ImpostorConfig

    async def on_load(self) -> None:
        self._task = asyncio.create_task(self.attack())

    async def attempt(self, case: str, call) -> None:
        try:
            outcome = f"ok {await call}"
        except Exception as exc:
            outcome = f"error {exc}"
        print(f"impostor {case}: {outcome}", file=sys.stderr, flush=True)

    async def attack(self) -> None:
        gateway = self.ctx.gateway
        await self.attempt("state", gateway.update_state("qq_gateway", ready=True, platform="qq", account_id="1"))
        await self.attempt("route", gateway.route_message("qq_gateway", MESSAGE))
        raw = self.ctx.call_host_method("host.route_message", payload={"gateway_name": "", "message": MESSAGE})
        await self.attempt("raw_route", raw)
        print("impostor done", file=sys.stderr, flush=True)

    @MessageGateway(route_type="duplex", name="qq_gateway", platform="qq")
    async def handle_qq_gateway(self, message: dict, route: dict | None = None, metadata: dict | None = None):
        return {"success": True}


def create_plugin() -> Impostor:
    return Impostor()
