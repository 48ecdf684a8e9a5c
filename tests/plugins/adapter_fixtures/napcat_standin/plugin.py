"""A stand-in for the official NapCat adapter plugin (Mai-with-u/MaiBot-Napcat-Adapter, branch main, 1.4.0),
written from what that plugin does on the wire (facts, not its code):

- One `@MessageGateway(route_type="duplex", platform="qq", protocol="napcat")` component `napcat_gateway`.
- on_load starts a background connection loop and returns: aiohttp `ws_connect("ws://host:port")` with
  `Authorization: Bearer <token>` when a token is set and websocket pings every heartbeat_interval;
  reconnect every reconnect_delay_sec until on_unload.
- Actions `{"action", "params", "echo": <uuid hex>}`, answered by echo, waited for action_timeout_sec;
  frames without echo are events by post_type. A closed connection fails the pending actions
  ("NapCat connection interrupted").
- On connect: get_login_info (3 tries, 1 s apart) → `host.update_message_gateway_state` ready, platform
  qq, account_id the login's user_id, scope connection_id, metadata {ws_url}; reported again (until once
  accepted) on lifecycle connect, good heartbeats and before routing a message; `ready: false` on
  disconnect or a heartbeat that is not online and good. What it believes is the last answer it got: a
  ready report accepted makes it "reported" (logged "NapCat 消息网关已激活路由"), and it reports
  `ready: false` only while "reported", forgetting it once that report is answered (so a ready answer
  that came back meanwhile counts for nothing; one that comes back after it counts again).
- A message event → MessageDict (text data a string; at → get_group_member_info / get_stranger_info for
  the names, `is_mentioned` when it names self_id; reply → get_msg; image → the url's bytes as
  binary_data_base64; plain text with "@<card or nickname>") → `host.route_message` with route_metadata
  {self_id[, connection_id]}, external_message_id and dedupe_key the NapCat message_id.
- The handler: group_info.group_id / additional_config.platform_io_target_group_id → send_group_msg, else
  platform_io_target_user_id / target_user_id / route.target_user_id → send_private_msg (ids as strings);
  answers {"success": true, "external_message_id", "metadata": {"action", "adapter_callbacks":
  [message_id_echo]}}, {"success": false, "error": wording, "metadata": {"retcode"}} when NapCat refused,
  {"success": false, "error": "NapCat is not connected"} when it is not connected.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
import uuid
from typing import Any

import aiohttp
from maibot_sdk import Field, MaiBotPlugin, MessageGateway, PluginConfigBase, Tool
from maibot_sdk.types import ToolParameterInfo, ToolParamType

GATEWAY = "napcat_gateway"


class PluginSection(PluginConfigBase):
    enabled: bool = Field(default=False, description="Connect to NapCat")
    enable_private_chat_tool: bool = Field(default=False, description="Offer open_private_chat")
    config_version: str = Field(default="0.1.0", description="Config version")


class ServerSection(PluginConfigBase):
    host: str = Field(default="127.0.0.1", description="NapCat forward WebSocket host")
    port: int = Field(default=3001, description="NapCat forward WebSocket port")
    token: str = Field(default="", description="NapCat access token")
    heartbeat_interval: float = Field(default=30.0, description="Websocket ping seconds")
    reconnect_delay_sec: float = Field(default=5.0, description="Seconds between reconnects")
    action_timeout_sec: float = Field(default=15.0, description="Seconds an action may take")
    connection_id: str = Field(default="", description="Route scope")

    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"


class StandinSettings(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)
    napcat_server: ServerSection = Field(default_factory=ServerSection)


class NapCatStandin(MaiBotPlugin):
    config_model = StandinSettings

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._background: set[asyncio.Task] = set()
        self._reported: str = ""  # the account last reported ready (and accepted)
        self._self_id = ""

    @property
    def _server(self) -> ServerSection:
        return self.config.napcat_server

    async def on_load(self) -> None:
        # As the official plugin: its optional tool switched by its config at every load (errors only logged).
        switch = self.ctx.component.enable_component if self.config.plugin.enable_private_chat_tool else None
        try:
            result = await (switch or self.ctx.component.disable_component)("open_private_chat", "TOOL")
            self.ctx.logger.info("NapCat 主动私聊工具启停: %s", result)
        except Exception as exc:
            self.ctx.logger.warning("NapCat 同步主动私聊工具启停状态失败: %s", exc)
        if self.config.plugin.enabled and self.config.plugin.config_version == "0.1.0":
            self._task = asyncio.create_task(self._connection_loop())

    async def on_unload(self) -> None:
        task, self._task = self._task, None
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._report_disconnected()

    # --- transport -----------------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        server = self._server
        headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
        while True:
            try:
                timeout = aiohttp.ClientTimeout(total=None, connect=10)
                async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
                    async with session.ws_connect(server.ws_url(), heartbeat=server.heartbeat_interval or None) as ws:
                        self._ws = ws
                        self.ctx.logger.info("NapCat 适配器已连接: %s", server.ws_url())
                        await self._receive(ws)
                        self.ctx.logger.warning("NapCat 适配器连接已断开 (close_code=%s)", ws.close_code)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.ctx.logger.warning("NapCat 适配器连接失败: %s", exc)
            finally:
                self._ws = None
                for future in self._pending.values():
                    if not future.done():
                        future.set_exception(RuntimeError("NapCat connection interrupted"))
                self._pending.clear()
                await self._report_disconnected()
            await asyncio.sleep(server.reconnect_delay_sec)

    async def _receive(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._spawn(self._bootstrap())
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                if frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    return
                continue
            try:
                payload = json.loads(frame.data)
            except ValueError:
                continue
            if not isinstance(payload, dict):
                continue
            if echo := str(payload.get("echo") or ""):
                future = self._pending.get(echo)
                if future is not None and not future.done():
                    future.set_result(payload)
                continue
            self._spawn(self._event(payload))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)

        def done(t: asyncio.Task) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.ctx.logger.error("NapCat 适配器后台任务异常: %s", t.exception())

        task.add_done_callback(done)

    async def call_action(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        ws = self._ws
        if ws is None or ws.closed:
            raise RuntimeError("NapCat is not connected")
        echo = uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._pending[echo] = future
        try:
            await ws.send_str(json.dumps({"action": action, "params": params, "echo": echo}, ensure_ascii=False))
            return await asyncio.wait_for(future, self._server.action_timeout_sec)
        finally:
            self._pending.pop(echo, None)

    async def _data(self, action: str, params: dict[str, Any]) -> Any:
        """An action's data, None when it failed (as the official query service's safe calls)."""
        try:
            response = await self.call_action(action, params)
        except Exception:
            return None
        return response.get("data") if str(response.get("status")).lower() == "ok" else None

    # --- gateway state -------------------------------------------------------------------------------

    async def _bootstrap(self) -> None:
        for attempt in range(3):
            login = await self._data("get_login_info", {})
            if isinstance(login, dict) and str(login.get("user_id") or ""):
                self._self_id = str(login["user_id"])
                await self._report_connected(self._self_id)
                return
            if attempt < 2:
                await asyncio.sleep(1.0)
        self.ctx.logger.error("NapCat 消息网关未能完成路由激活")

    async def _report_connected(self, account: str) -> bool:
        if not account or self._reported == account:
            return bool(account)
        server = self._server
        try:
            accepted = await self.ctx.gateway.update_state(
                GATEWAY,
                ready=True,
                platform="qq",
                account_id=account,
                scope=server.connection_id,
                metadata={"ws_url": server.ws_url()},
            )
        except Exception as exc:
            self.ctx.logger.warning("NapCat 消息网关上报连接就绪状态失败: %s", exc)
            return False
        if accepted:
            self._reported = account
            self.ctx.logger.info("NapCat 消息网关已激活路由: platform=qq account_id=%s", account)
        return accepted

    async def _report_disconnected(self) -> None:
        if not self._reported:
            return
        try:
            await self.ctx.gateway.update_state(GATEWAY, ready=False, platform="qq")
        except Exception as exc:
            self.ctx.logger.warning("NapCat 消息网关上报断开状态失败: %s", exc)
        finally:
            self._reported = ""  # once answered: a ready answer that came meanwhile is overridden

    # --- events --------------------------------------------------------------------------------------

    async def _event(self, payload: dict[str, Any]) -> None:
        post_type = payload.get("post_type")
        self_id = str(payload.get("self_id") or "")
        if post_type == "meta_event":
            kind = payload.get("meta_event_type")
            status = payload.get("status") if isinstance(payload.get("status"), dict) else {}
            connected = kind == "lifecycle" and payload.get("sub_type") == "connect"
            if connected or (kind == "heartbeat" and status.get("online") and status.get("good")):
                await self._report_connected(self_id)
            elif kind == "heartbeat":
                await self._report_disconnected()
        elif post_type == "message":
            await self._message(payload, self_id)

    async def _message(self, payload: dict[str, Any], self_id: str) -> None:
        if self_id:
            await self._report_connected(self_id)
        sender = payload.get("sender") if isinstance(payload.get("sender"), dict) else {}
        user_id = str(payload.get("user_id") or sender.get("user_id") or "")
        if not user_id or user_id == self_id:
            return
        message = await self._message_dict(payload, self_id, user_id, sender)
        metadata = {"self_id": self_id} if self_id else {}
        if self._server.connection_id:
            metadata["connection_id"] = self._server.connection_id
        external = str(payload.get("message_id") or "")
        await self.ctx.gateway.route_message(
            GATEWAY, message, route_metadata=metadata, external_message_id=external, dedupe_key=external
        )

    async def _message_dict(self, payload: dict, self_id: str, user_id: str, sender: dict) -> dict[str, Any]:
        group_id = str(payload.get("group_id") or "")
        segments, mentioned = await self._segments(payload.get("message"), self_id, group_id)
        if not segments:
            segments = [{"type": "text", "data": "[unsupported]"}]
        plain = _plain_text(segments)
        kind = payload.get("message_type") or "private"
        additional: dict[str, Any] = {"self_id": self_id, "napcat_message_type": kind}
        if group_id:
            additional["platform_io_target_group_id"] = group_id
        else:
            additional["platform_io_target_user_id"] = user_id
        info: dict[str, Any] = {
            "user_info": {
                "user_id": user_id,
                "user_nickname": str(sender.get("nickname") or sender.get("card") or user_id),
                "user_cardname": str(sender.get("card") or "") or None,
            },
            "additional_config": additional,
        }
        if group_id:
            name = str(payload.get("group_name") or f"group_{group_id}")
            info["group_info"] = {"group_id": group_id, "group_name": name}
        sent_at = payload.get("time") if isinstance(payload.get("time"), int | float) else time.time()
        return {
            "message_id": str(payload.get("message_id") or f"napcat-{uuid.uuid4().hex}"),
            "timestamp": str(float(sent_at)),
            "platform": "qq",
            "message_info": info,
            "raw_message": segments,
            "is_mentioned": mentioned,
            "is_at": mentioned,
            "is_emoji": False,
            "is_picture": False,
            "is_command": plain.startswith("/"),
            "is_notify": False,
            "session_id": "",
            "processed_plain_text": plain,
            "display_message": plain,
        }

    async def _segments(self, raw: Any, self_id: str, group_id: str) -> tuple[list[dict[str, Any]], bool]:
        out: list[dict[str, Any]] = []
        mentioned = False
        for seg in raw if isinstance(raw, list) else []:
            kind, data = seg.get("type"), seg.get("data") if isinstance(seg.get("data"), dict) else {}
            if kind == "text" and data.get("text"):
                out.append({"type": "text", "data": str(data["text"])})
            elif kind == "at" and (qq := str(data.get("qq") or "")):
                nickname, card = await self._names(group_id, qq)
                names = {"target_user_nickname": nickname, "target_user_cardname": card}
                out.append({"type": "at", "data": {"target_user_id": qq, **names}})
                mentioned = mentioned or (bool(self_id) and qq == self_id)
            elif kind == "reply" and (target := str(data.get("id") or "")):
                quoted = await self._data("get_msg", {"message_id": target})
                reply: dict[str, Any] = {"target_message_id": target}
                if isinstance(quoted, dict):
                    reply["target_message_sender_id"] = str(quoted.get("user_id") or "") or None
                out.append({"type": "reply", "data": reply})
            elif kind == "image":
                out.append(await self._image(str(data.get("url") or "")))
            elif kind == "face":
                out.append({"type": "text", "data": "[表情]"})
        return out, mentioned

    async def _names(self, group_id: str, qq: str) -> tuple[str | None, str | None]:
        if qq == "all":
            return None, None
        if group_id:
            member = await self._data("get_group_member_info", {"group_id": group_id, "user_id": qq, "no_cache": True})
            if isinstance(member, dict) and (member.get("nickname") or member.get("card")):
                return member.get("nickname") or None, member.get("card") or None
        stranger = await self._data("get_stranger_info", {"user_id": qq, "no_cache": False})
        return (stranger.get("nickname") or None, None) if isinstance(stranger, dict) else (None, None)

    async def _image(self, url: str) -> dict[str, Any]:
        body = b""
        if url:
            try:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
                    async with session.get(url) as response:
                        body = await response.read() if response.status == 200 else b""
            except Exception:
                body = b""
        if not body:
            return {"type": "text", "data": "[image]"}
        return {
            "type": "image",
            "data": "",
            "hash": hashlib.sha256(body).hexdigest(),
            "binary_data_base64": base64.b64encode(body).decode(),
        }

    USER_ID = ToolParameterInfo(name="user_id", param_type=ToolParamType.STRING, description="QQ", required=True)

    @Tool(
        "open_private_chat",
        description="向指定 QQ 用户发送一条私聊消息，用于主动开启私聊。",
        parameters=[USER_ID],
        enabled=False,
    )
    async def tool_open_private_chat(self, user_id: str = "", **kwargs: Any) -> dict[str, Any]:
        return {"success": False, "error": "not in the stand-in"}

    # --- outbound ------------------------------------------------------------------------------------

    @MessageGateway(name=GATEWAY, route_type="duplex", platform="qq", protocol="napcat", description="NapCat 双工网关")
    async def handle_napcat_gateway(self, message: dict, route: dict | None = None, metadata: dict | None = None, **kw):
        try:
            action, params = _outbound_action(message, route or {})
            response = await self.call_action(action, params)
        except Exception as exc:
            return {"success": False, "error": str(exc)}
        if str(response.get("status", "")).lower() != "ok":
            return {
                "success": False,
                "error": str(response.get("wording") or response.get("message") or "NapCat send failed"),
                "metadata": {"retcode": response.get("retcode")},
            }
        data = response.get("data") if isinstance(response.get("data"), dict) else {}
        external = str(data.get("message_id") or "")
        internal = str(message.get("message_id") or "")
        callbacks = []
        if internal and external and internal != external:
            echo = {"type": "echo", "echo": internal, "actual_id": external}
            callbacks.append({"name": "message_id_echo", "payload": {"content": echo}})
        return {
            "success": True,
            "external_message_id": external or None,
            "metadata": {"action": action, "adapter_callbacks": callbacks},
        }


def _plain_text(segments: list[dict[str, Any]]) -> str:
    parts = []
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data")
        if kind == "text":
            parts.append(str(data or ""))
        elif kind == "at" and isinstance(data, dict):
            name = data.get("target_user_cardname") or data.get("target_user_nickname") or data.get("target_user_id")
            parts.append(f"@{name}" if name else "")
        elif kind in ("reply", "forward", "image", "emoji", "voice"):
            parts.append(f"[{kind}]")
    return "".join(parts).strip() or "[unsupported]"


def _outbound_segments(raw: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for seg in raw if isinstance(raw, list) else []:
        kind, data = seg.get("type"), seg.get("data")
        if kind == "text":
            out.append({"type": "text", "data": {"text": str(data or "")}})
        elif kind == "at" and isinstance(data, dict) and data.get("target_user_id"):
            out.append({"type": "at", "data": {"qq": str(data["target_user_id"])}})
        elif kind == "reply":
            target = data.get("target_message_id") if isinstance(data, dict) else data
            if str(target or "").strip():
                out.append({"type": "reply", "data": {"id": str(target).strip()}})
        elif kind in ("image", "emoji") and seg.get("binary_data_base64"):
            file = f"base64://{seg['binary_data_base64']}"
            out.append({"type": "image", "data": {"file": file, "sub_type": 0 if kind == "image" else 1}})
        elif kind == "imageurl" and data:
            out.append({"type": "image", "data": {"file": str(data)}})
        elif kind == "face" and str(data or "").strip():
            out.append({"type": "face", "data": {"id": str(data).strip()}})
        else:
            out.append({"type": "text", "data": {"text": f"[unsupported:{kind or 'unknown'}]"}})
    return out or [{"type": "text", "data": {"text": ""}}]


def _outbound_action(message: dict[str, Any], route: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    info = message.get("message_info") if isinstance(message.get("message_info"), dict) else {}
    group = info.get("group_info") if isinstance(info.get("group_info"), dict) else {}
    additional = info.get("additional_config") if isinstance(info.get("additional_config"), dict) else {}
    segments = _outbound_segments(message.get("raw_message"))
    if group_id := str(group.get("group_id") or additional.get("platform_io_target_group_id") or "").strip():
        return "send_group_msg", {"group_id": group_id, "message": segments}
    user_id = additional.get("platform_io_target_user_id") or additional.get("target_user_id")
    user_id = str(user_id or route.get("target_user_id") or "").strip()
    if not user_id:
        raise ValueError("Outbound private message is missing target_user_id")
    return "send_private_msg", {"message": segments, "user_id": user_id}


def create_plugin() -> NapCatStandin:
    return NapCatStandin()
