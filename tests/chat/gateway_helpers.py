"""Helpers for the gateway tests: the real maim_message 0.6.8 client, a raw websocket."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from channels.testing import WebsocketCommunicator

from tests.conftest import wait_for_async

# The adapter tokens the in-process `app` fixture (tests/chat/conftest.py) admits: TOKEN for qq,
# DISCORD_TOKEN for discord.
TOKEN = "in-process-token"
DISCORD_TOKEN = "in-process-token-discord"
ADAPTER_TOKENS = f"qq:{TOKEN},discord:{DISCORD_TOKEN}"
# Under a loaded machine the gateway's first call (starting its tasks) can take more than the
# communicator's default second.
TIMEOUT = 10

ACCEPT = ["text", "image", "emoji", "reply", "voice", "command", "voiceurl", "music", "videourl", "file"]


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"


def envelope(
    *,
    platform: str = "qq",
    user_id: Any = 10001,
    nickname: str = "Alice",
    group_id: Any = None,
    group_name: str = "",
    segments: list[dict] | None = None,
    text: str = "hello 你好",
    message_id: Any = None,
    accept_format: list[str] | None = None,
    additional_config: dict | None = None,
) -> dict:
    """A frame exactly as maim_message's MessageBase.to_dict() builds it."""
    from maim_message import BaseMessageInfo, FormatInfo, GroupInfo, MessageBase, Seg, UserInfo

    def seg(d: dict) -> Seg:
        if d["type"] == "seglist":
            return Seg("seglist", [seg(c) for c in d["data"]])
        return Seg(d["type"], d["data"])

    segs = segments if segments is not None else [{"type": "text", "data": text}]
    info = BaseMessageInfo(
        platform=platform,
        message_id=message_id if message_id is not None else uuid.uuid4().int % 10**10,
        time=time.time(),
        user_info=UserInfo(platform=platform, user_id=user_id, user_nickname=nickname, user_cardname=""),
        group_info=GroupInfo(platform=platform, group_id=group_id, group_name=group_name) if group_id else None,
        format_info=FormatInfo(content_format=["text", "image"], accept_format=accept_format or ACCEPT),
        additional_config=additional_config or {},
    )
    top = Seg("seglist", [seg(s) for s in segs])
    return MessageBase(message_info=info, message_segment=top, raw_message=text).to_dict()


def adapter(application, *, token: str | None = TOKEN, platform: str = "qq") -> WebsocketCommunicator:
    """A 0.6.x adapter's socket: the two headers maim_message sends."""
    headers = [(b"platform", platform.encode())]
    if token is not None:
        headers.append((b"authorization", token.encode()))
    return WebsocketCommunicator(application, "/ws", headers=headers)


class Adapter06:
    """An adapter built on the real maim_message 0.6.8 client (Router), as MaiBot adapters use it."""

    def __init__(self, base: str, *, platform: str = "qq", token: str | None = None) -> None:
        from maim_message import RouteConfig, Router, TargetConfig

        self.platform = platform
        self.received: asyncio.Queue[dict] = asyncio.Queue()
        self.router = Router(RouteConfig(route_config={platform: TargetConfig(url=ws_url(base), token=token)}))
        self.router.register_class_handler(self._on_message)
        self._task: asyncio.Task | None = None

    async def _on_message(self, message: dict) -> None:
        await self.received.put(message)

    async def start(self, timeout: float = 20.0) -> Adapter06:
        self._task = asyncio.create_task(self.router.run())

        async def connected() -> bool:
            return self.router.check_connection(self.platform)

        await wait_for_async(connected, timeout=timeout, what="the maim_message client to connect")
        return self

    async def send(self, frame: dict) -> None:
        assert await self.router.clients[self.platform].send_message(frame)

    async def echo(self, our_id: str, actual_id: Any) -> None:
        await self.router.send_custom_message(
            self.platform, "message_id_echo", {"type": "echo", "echo": our_id, "actual_id": actual_id}
        )

    async def next_message(self, timeout: float = 20.0) -> dict:
        return await asyncio.wait_for(self.received.get(), timeout)

    async def stop(self) -> None:
        await self.router.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class RawSocket:
    """A bare websocket client (the `websockets` library) for what the real client never sends."""

    def __init__(self, base: str, *, platform: str | None = "qq", token: str | None = None) -> None:
        self.url = ws_url(base)
        self.headers = {}
        if platform is not None:
            self.headers["platform"] = platform
        if token is not None:
            self.headers["Authorization"] = token
        self.ws = None

    async def __aenter__(self) -> RawSocket:
        import websockets

        self.ws = await websockets.connect(
            self.url, additional_headers=self.headers, max_size=None, ping_interval=None, compression=None
        )
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def send(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def send_json(self, frame: Any) -> None:
        await self.ws.send(json.dumps(frame))

    async def recv_json(self, timeout: float = 20.0) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def closed_with(self, timeout: float = 20.0) -> int | None:
        """Wait until the server closes the socket; the close code it sent."""
        import websockets

        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                await asyncio.wait_for(self.ws.recv(), max(0.1, deadline - time.monotonic()))
        except websockets.ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
        raise AssertionError("the server did not close the socket")


def write_bot_config(data_dir: Path, text: str) -> None:
    """A server's bot_config.toml (start_server(name) uses tmp_path / f"data-{name}")."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "bot_config.toml").write_text(text, encoding="utf-8")


def never_echoes(*platforms: str) -> None:
    """Record these platforms as shown never to echo (AdapterPlatform.no_echo_at, chat.delivery_gate), as
    a connection that stayed up through a confirm window would have: their adapters take whatever is due
    at once, each message once. For a test whose adapter does not echo and which is about something else
    than the gate (an unproven platform gets one message at a time). Before the adapter connects: the
    gateway reads it then."""
    from django.utils import timezone

    from chat.models import AdapterPlatform

    for platform in platforms:
        AdapterPlatform.objects.update_or_create(platform=platform, defaults={"no_echo_at": timezone.now()})


ROOT = Path(__file__).resolve().parent.parent.parent
MM07_PYTHON = ROOT / ".venv-mm07" / "bin" / "python"


class Adapter07:
    """The real maim_message 0.7.x (Socket.IO) client, run from .venv-mm07 by tests/mm07/adapter.py."""

    def __init__(self, base: str, *, platform: str = "qq", token: str | None = None) -> None:
        self.args = [str(MM07_PYTHON), str(ROOT / "tests" / "mm07" / "adapter.py"), ws_url(base), platform]
        if token is not None:
            self.args.append(token)
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None

    async def start(self) -> str:
        """Start the client; returns its first event: "connected" or "refused"."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=64 * 1024 * 1024,
        )
        self._reader = asyncio.create_task(self._read())
        first = await self.next_event(timeout=60)
        return first["event"]

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            await self.events.put(json.loads(line))
        await self.events.put({"event": "exited"})

    async def next_event(self, timeout: float = 20.0) -> dict:
        return await asyncio.wait_for(self.events.get(), timeout)

    async def next_message(self, timeout: float = 20.0) -> dict:
        while True:
            event = await self.next_event(timeout)
            if event["event"] == "message":
                return event["data"]
            if event["event"] in ("exited", "disconnected"):
                raise AssertionError(f"the 0.7 client went away: {event}")

    async def command(self, cmd: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                await self.command({"cmd": "stop"})
                await asyncio.wait_for(self.proc.wait(), 15)
            except (TimeoutError, ConnectionError):
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


class ApiClient(Adapter07):
    """The real maim_message WebSocketClient in API-Server mode (x-apikey / x-platform, APIMessageBase
    packages), wired as MaiBot-Napcat-Adapter 0.7.0 wires it, run by tests/mm07/api_client.py: from
    .venv-mm07 (0.7.5, Socket.IO) or, with `python=LEGACY_PYTHON`, from .venv (0.6.8, plain websocket).
    The messages it receives arrive as the legacy dict the adapter's send handler reads."""

    def __init__(self, base: str, *, api_key: str, platform: str = "qq", python: Path = MM07_PYTHON) -> None:
        super().__init__(base, platform=platform)
        script = ROOT / "tests" / "mm07" / "api_client.py"
        self.args = [str(python), str(script), ws_url(base), platform, api_key]
        self.version = ""

    async def start(self) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=64 * 1024 * 1024,
        )
        self._reader = asyncio.create_task(self._read())
        first = await self.next_event(timeout=60)
        self.version = first.get("version", "")
        return first["event"]


# The 0.6.8 environment's interpreter (the project's own .venv).
LEGACY_PYTHON = ROOT / ".venv" / "bin" / "python"
