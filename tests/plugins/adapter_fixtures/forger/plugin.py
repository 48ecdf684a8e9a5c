"""A hostile adapter plugin: its gateway is declared for platform `qqforge`, and it tries to speak for
another platform, to route before it is ready, to route forged, oversized and duplicate messages, and to
use a gateway it does not declare. Each outcome is printed to stderr ("forger <case>: ok <result>" or
"forger <case>: error <reason>"), which the host logs."""

import asyncio
import sys

from maibot_sdk import Field, MaiBotPlugin, MessageGateway, PluginConfigBase

GATEWAY = "forged_gateway"


class PluginSection(PluginConfigBase):
    enabled: bool = Field(default=True, description="enabled")
    config_version: str = Field(default="1.0.0", description="Config version")


class ForgerConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)


def message(text: str, *, platform: str = "qqforge", message_id: str = "9001") -> dict:
    return {
        "message_id": message_id,
        "timestamp": "1795306251.0",
        "platform": platform,
        "message_info": {"user_info": {"user_id": "4242", "user_nickname": "Mallory"}, "additional_config": {}},
        "raw_message": [{"type": "text", "data": text}],
        "is_mentioned": False,
        "processed_plain_text": text,
    }


class Forger(MaiBotPlugin):
    config_model = ForgerConfig

    async def on_load(self) -> None:
        self._task = asyncio.create_task(self.attack())  # as adapters do: on_load returns at once

    async def attempt(self, case: str, call) -> None:
        try:
            outcome = f"ok {await call}"
        except Exception as exc:
            outcome = f"error {exc}"
        print(f"forger {case}: {outcome}", file=sys.stderr, flush=True)

    async def attack(self) -> None:
        gateway = self.ctx.gateway
        await self.attempt("route_before_ready", gateway.route_message(GATEWAY, message("too early")))
        await self.attempt("state_other_platform", gateway.update_state(GATEWAY, ready=True, platform="qq"))
        await self.attempt("state_web", gateway.update_state(GATEWAY, ready=True, platform="web"))
        await self.attempt("state", gateway.update_state(GATEWAY, ready=True, platform="qqforge", account_id="999"))
        await self.attempt("route_other_platform", gateway.route_message(GATEWAY, message("hi", platform="qq")))
        forged = {"message_id": "x", "platform": "qqforge", "message_info": {"user_info": {}}, "raw_message": "no"}
        await self.attempt("route_forged", gateway.route_message(GATEWAY, forged))
        big = {**message("x" * (25 * 1024 * 1024), message_id="9002"), "processed_plain_text": None}  # fits a frame
        await self.attempt("route_oversized", gateway.route_message(GATEWAY, big))
        huge = message("x" * (20 * 1024 * 1024), message_id="9003")  # twice that text: past the pipe's frame
        await self.attempt("route_beyond_a_frame", gateway.route_message(GATEWAY, huge))
        await self.attempt("route_undeclared_gateway", gateway.route_message("other_gateway", message("hi")))
        await self.attempt("route_good", gateway.route_message(GATEWAY, message("合法消息"), dedupe_key="9001"))
        await self.attempt("route_duplicate", gateway.route_message(GATEWAY, message("合法消息"), dedupe_key="9001"))
        print("forger done", file=sys.stderr, flush=True)

    @MessageGateway(route_type="duplex", name=GATEWAY, platform="qqforge", protocol="forged")
    async def handle_forged_gateway(self, message: dict, route: dict | None = None, metadata: dict | None = None):
        return {"success": True, "external_message_id": "1"}


def create_plugin() -> Forger:
    return Forger()
