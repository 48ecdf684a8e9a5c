"""A stand-in for NapCat's OneBot v11 forward WebSocket server (the "WebSocket server" network of NapCat),
behaving as NapCatQQ does (read in its source, packages/napcat-onebot: network/websocket-server.ts,
action/OneBotAction.ts, event/meta/*, types/message.ts). Facts, not code, carried over:

- One server on HOST:PORT. A client on `/api` gets actions only; any other path also gets events. The
  token (if set) is read from `?access_token=` or the `Authorization: Bearer` header; a wrong one gets the
  frame {"status": "failed", "retcode": 1403, "data": null, "message": "token验证失败", "wording": …,
  "echo": null, "stream": "normal-action"} and the socket is closed (NapCat's `ws` sends a close frame with
  no status, seen as 1005; this stand-in closes with 1000 — the clients we test read both alike).
- An event client is sent the lifecycle event {"time", "self_id", "post_type": "meta_event",
  "meta_event_type": "lifecycle", "sub_type": "connect"} at once, and heartbeats {"time", "self_id",
  "post_type": "meta_event", "meta_event_type": "heartbeat", "status": {"online", "good"}, "interval"}
  every `heart_interval_ms` while at least one event client is connected.
- An action frame {"action", "params", "echo"} is answered {"status": "ok", "retcode": 0, "data",
  "message": "", "wording": "", "echo", "stream": "normal-action"}; an unknown action retcode 1404
  ("不支持的API <name>"), a failing one retcode 1200 with the error text, JSON it cannot parse 1400.
- Message events (OB11Message): {"self_id", "user_id", "time", "message_id", "message_seq", "real_id",
  "real_seq", "message_type": "private" | "group", "sender": {"user_id", "nickname", "card"[, "role"]},
  "raw_message", "font": 14, "sub_type": "friend" | "normal", "message": [segments], "message_format":
  "array", "post_type": "message"[, "group_id", "group_name"]}; ids are numbers; segment data values
  strings ({"type": "at", "data": {"qq": "10000", "name": …}}, {"type": "reply", "data": {"id": "…"}},
  {"type": "image", "data": {"file", "url", "sub_type": 0, "summary": ""}}).
- `stop()` is NapCat going away (every socket closed, the port free); `start()` again is NapCat back on
  the same port. `refuse` makes an action fail as NapCat does (retcode 1200 and its message); `answers`
  False makes NapCat take sends without ever answering (the client's own timeout ends the wait).

It also serves plain HTTP GETs of `/img/<name>` (the PNG bytes in `images`), standing in for QQ's image
CDN that adapters download inbound images from.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Response


def png(width: int = 1, height: int = 1) -> bytes:
    """A valid RGBA PNG of that size (transparent), standing in for a QQ image."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\x00\x00\x00\x00" * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@dataclass
class Sent:
    """A message NapCat accepted (what the QQ user sees): the action, its target, its OneBot segments."""

    action: str
    target: str
    message: list[dict[str, Any]]
    message_id: int
    at: float = field(default_factory=time.time)

    def text(self) -> str:
        return "".join(s["data"].get("text", "") for s in self.message if s.get("type") == "text")


def _reply(data: Any, echo: Any, status: str = "ok", retcode: int = 0, message: str = "") -> dict[str, Any]:
    return {
        "status": status,
        "retcode": retcode,
        "data": data,
        "message": message,
        "wording": message,
        "echo": echo,
        "stream": "normal-action",
    }


class NapCatOneBot:
    """The forward WebSocket server of one logged-in QQ account (`self_id`)."""

    def __init__(
        self, *, self_id: int = 3_000_000_001, nickname: str = "小麦", token: str = "", heart_interval_ms: int = 30_000
    ) -> None:
        self.self_id, self.nickname, self.token, self.heart_interval_ms = self_id, nickname, token, heart_interval_ms
        self.port = 0
        self.server: Server | None = None
        self.event_clients: list[ServerConnection] = []
        self.clients: list[ServerConnection] = []
        self.actions: list[tuple[str, dict]] = []  # every action asked, in order
        self.sent: list[Sent] = []
        self.refuse: dict[str, str] = {}  # action -> the error NapCat answers it with (retcode 1200)
        self.answers = True
        self.online = True
        self.refused_tokens = 0
        self.members: dict[tuple[str, str], dict[str, Any]] = {}  # (group, user) -> get_group_member_info data
        self.messages: dict[int, dict[str, Any]] = {}  # message_id -> the event (get_msg)
        self.images: dict[str, bytes] = {"cat.png": png(2, 2)}
        self._ids = itertools.count(1_800_000_001)
        self._heartbeat: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.connected = asyncio.Event()  # an event client is connected

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    # --- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> NapCatOneBot:
        self.server = await serve(
            self._serve, "127.0.0.1", self.port, process_request=self._http, max_size=50 * 1024 * 1024
        )
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """NapCat goes away: its sockets closed, its port free."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        self._stop_heartbeat()
        self.event_clients.clear()
        self.clients.clear()
        self.connected.clear()

    # --- the socket ----------------------------------------------------------------------------------

    def _http(self, connection: ServerConnection, request) -> Response | None:
        path = urlsplit(request.path).path
        if path.startswith("/img/") and "upgrade" not in request.headers.get("Connection", "").lower():
            body = self.images.get(path.removeprefix("/img/"))
            if body is None:
                return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
            headers = Headers([("Content-Type", "image/png"), ("Content-Length", str(len(body)))])
            return Response(200, "OK", headers, body)
        return None

    def _authorized(self, connection: ServerConnection) -> bool:
        if not self.token:
            return True
        request = connection.request
        query = parse_qs(urlsplit(request.path).query).get("access_token", [""])[0]
        header = (request.headers.get("Authorization") or "").split("Bearer ")[-1]
        return (query or header) == self.token

    async def _serve(self, connection: ServerConnection) -> None:
        if not self._authorized(connection):
            self.refused_tokens += 1
            await connection.send(json.dumps(_reply(None, None, "failed", 1403, "token验证失败"), ensure_ascii=False))
            await connection.close()
            return
        path = urlsplit(connection.request.path).path
        events = path not in ("/api", "/api/")
        self.clients.append(connection)
        if events:
            await connection.send(json.dumps(self._meta("lifecycle", sub_type="connect")))
            self.event_clients.append(connection)
            self.connected.set()
            self._start_heartbeat()
        try:
            async for raw in connection:
                task = asyncio.ensure_future(self._answer(connection, raw))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self.clients.remove(connection)
            with contextlib.suppress(ValueError):
                self.event_clients.remove(connection)
            if not self.event_clients:
                self._stop_heartbeat()
                self.connected.clear()

    def _meta(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"time": int(time.time()), "self_id": self.self_id, "post_type": "meta_event"}
        return {**event, "meta_event_type": kind, **fields}

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None and self.heart_interval_ms > 0:
            self._heartbeat = asyncio.ensure_future(self._beat())

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heart_interval_ms / 1000)
            status = {"online": self.online, "good": True}
            await self.emit(self._meta("heartbeat", status=status, interval=self.heart_interval_ms))

    async def emit(self, event: dict[str, Any]) -> None:
        """An event to every event client (as NapCat's onEvent)."""
        for client in list(self.event_clients):
            with contextlib.suppress(Exception):
                await client.send(json.dumps(event, ensure_ascii=False))

    # --- actions -------------------------------------------------------------------------------------

    async def _answer(self, connection: ServerConnection, raw: str | bytes) -> None:
        echo = None
        try:
            frame = json.loads(raw)
            echo = frame.get("echo")
            action, params = str(frame.get("action")), frame.get("params") or {}
        except (ValueError, AttributeError):
            reply = _reply(None, echo, "failed", 1400, "json解析失败,请检查数据格式")
        else:
            self.actions.append((action, params))
            reply = await self._act(action, params, echo)
            if reply is None:
                return  # taken, never answered
        with contextlib.suppress(Exception):
            await connection.send(json.dumps(reply, ensure_ascii=False))

    async def _act(self, action: str, params: dict[str, Any], echo: Any) -> dict[str, Any] | None:
        if action in self.refuse:
            return _reply(None, echo, "failed", 1200, self.refuse[action])
        handler = getattr(self, f"_do_{action}", None)
        if handler is None:
            return _reply(None, echo, "failed", 1404, f"不支持的API {action}")
        try:
            data = handler(params)
        except LookupError as exc:
            return _reply(None, echo, "failed", 1200, str(exc))
        if action.startswith("send_") and not self.answers:
            return None
        return _reply(data, echo)

    def _do_get_login_info(self, params: dict) -> dict:
        return {"user_id": self.self_id, "nickname": self.nickname}

    def _send(self, action: str, target: Any, params: dict) -> dict:
        message_id = next(self._ids)
        segments = params.get("message") if isinstance(params.get("message"), list) else []
        self.sent.append(Sent(action, str(target), segments, message_id))
        return {"message_id": message_id}

    def _do_send_private_msg(self, params: dict) -> dict:
        return self._send("send_private_msg", params["user_id"], params)

    def _do_send_group_msg(self, params: dict) -> dict:
        return self._send("send_group_msg", params["group_id"], params)

    def _do_send_private_forward_msg(self, params: dict) -> dict:
        return self._send("send_private_forward_msg", params["user_id"], params)

    def _do_send_group_forward_msg(self, params: dict) -> dict:
        return self._send("send_group_forward_msg", params["group_id"], params)

    def _do_get_group_member_info(self, params: dict) -> dict:
        member = self.members.get((str(params.get("group_id")), str(params.get("user_id"))))
        if member is None:
            raise LookupError("获取群成员信息失败")
        return member

    def _do_get_stranger_info(self, params: dict) -> dict:
        user_id = str(params.get("user_id"))
        if user_id == str(self.self_id):
            return {"user_id": self.self_id, "nickname": self.nickname}
        raise LookupError("获取用户信息失败")

    def _do_get_msg(self, params: dict) -> dict:
        event = self.messages.get(int(params.get("message_id") or 0))
        if event is None:
            raise LookupError("消息不存在")
        return event

    # --- what QQ users do ----------------------------------------------------------------------------

    def _message_event(self, kind: str, user_id: int, segments: list[dict], sender: dict[str, Any]) -> dict:
        message_id = next(self._ids)
        raw = "".join(s["data"].get("text", "") if s["type"] == "text" else f"[CQ:{s['type']}]" for s in segments)
        return {
            "self_id": self.self_id,
            "user_id": user_id,
            "time": int(time.time()),
            "message_id": message_id,
            "message_seq": message_id,
            "real_id": message_id,
            "real_seq": str(message_id),
            "message_type": kind,
            "sender": sender,
            "raw_message": raw,
            "font": 14,
            "sub_type": "friend" if kind == "private" else "normal",
            "message": segments,
            "message_format": "array",
            "post_type": "message",
        }

    async def private_message(self, user_id: int, segments: list[dict] | str, *, nickname: str = "Alice") -> int:
        """A friend writes to the bot; the event's message_id."""
        segments = [text(segments)] if isinstance(segments, str) else segments
        sender = {"user_id": user_id, "nickname": nickname, "card": ""}
        event = self._message_event("private", user_id, segments, sender)
        self.messages[event["message_id"]] = event
        await self.emit(event)
        return event["message_id"]

    async def group_message(
        self, group_id: int, user_id: int, segments: list[dict] | str, *, nickname: str = "Bob", card: str = "",
        group_name: str = "测试群",
    ) -> int:  # fmt: skip
        """A member writes in a group the bot is in; the event's message_id."""
        segments = [text(segments)] if isinstance(segments, str) else segments
        sender = {"user_id": user_id, "nickname": nickname, "card": card, "role": "member"}
        event = self._message_event("group", user_id, segments, sender)
        event.update(group_id=group_id, group_name=group_name)
        self.messages[event["message_id"]] = event
        await self.emit(event)
        return event["message_id"]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": value}}


def at(qq: int | str, name: str = "") -> dict[str, Any]:
    return {"type": "at", "data": {"qq": str(qq), "name": name}}


def image(url: str) -> dict[str, Any]:
    return {"type": "image", "data": {"file": url.rsplit("/", 1)[-1], "url": url, "sub_type": 0, "summary": ""}}
