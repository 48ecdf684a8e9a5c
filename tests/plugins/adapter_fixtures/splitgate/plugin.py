"""An adapter plugin with a receive-only gateway (`inbound`) and a send-only gateway (`outbound`) for one
platform, `qqsplit`. On load it reports both ready, routes one message through each and prints what each
call answered ("splitgate <case>: ok …" / "error …"); its send-only handler answers each hand-over with
the platform id "out-<our message id>"."""

import asyncio
import sys

from maibot_sdk import Field, MaiBotPlugin, MessageGateway, PluginConfigBase


class PluginSection(PluginConfigBase):
    enabled: bool = Field(default=True, description="enabled")
    config_version: str = Field(default="1.0.0", description="Config version")


class SplitConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)


def message(text: str, message_id: str) -> dict:
    return {
        "message_id": message_id,
        "platform": "qqsplit",
        "message_info": {"user_info": {"user_id": "5151", "user_nickname": "Sam"}},
        "raw_message": [{"type": "text", "data": text}],
    }


class SplitGate(MaiBotPlugin):
    config_model = SplitConfig

    async def on_load(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def attempt(self, case: str, call) -> None:
        try:
            outcome = f"ok {await call}"
        except Exception as exc:
            outcome = f"error {exc}"
        print(f"splitgate {case}: {outcome}", file=sys.stderr, flush=True)

    async def run(self) -> None:
        gateway = self.ctx.gateway
        await self.attempt("inbound_ready", gateway.update_state("inbound", ready=True, account_id="77"))
        await self.attempt("outbound_ready", gateway.update_state("outbound", ready=True, account_id="77"))
        await self.attempt("route_inbound", gateway.route_message("inbound", message("经接收网关", "s1")))
        await self.attempt("route_outbound", gateway.route_message("outbound", message("经发送网关", "s2")))
        print("splitgate done", file=sys.stderr, flush=True)

    @MessageGateway(route_type="receive", name="inbound", platform="qqsplit")
    async def handle_inbound(self, message: dict, route: dict | None = None, metadata: dict | None = None):
        return {"success": True, "external_message_id": "never"}

    @MessageGateway(route_type="send", name="outbound", platform="qqsplit")
    async def handle_outbound(self, message: dict, route: dict | None = None, metadata: dict | None = None):
        return {"success": True, "external_message_id": f"out-{message['message_id']}"}


def create_plugin() -> SplitGate:
    return SplitGate()
