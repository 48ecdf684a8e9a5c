"""A stand-in for MaiBot-Napcat-Adapter 0.7.0 (tag 0.7.0 == its `standalone` branch) in legacy mode,
with the NapCat on its other side, behaving as the real pair does where delivery is concerned.

What it copies from the adapter's source (facts, not code):
- src/mmc_com_layer.py (legacy mode): the real maim_message client, `Router` with one `TargetConfig`
  for its platform, `token=None` (legacy mode never sends a token), `register_class_handler`.
- src/send_handler/main_send_handler.py: a frame is `MessageBase.from_dict`-ed; a top-level `command`
  segment runs as a command (answered with `command_response`); otherwise the segments are turned into
  NapCat's (nothing left: logs 现在暂时不支持解析此回复！ and drops it), then a group message is sent
  only when `group_info` **and** `user_info` are present, a private one when `user_info` alone is;
  neither: logs 无法识别的消息类型 and drops it. Nothing is reported back in any of these cases.
- src/send_handler/nc_sending.py + src/response_pool.py: the action goes to NapCat over the socket
  NapCat opened to the adapter; the answer is awaited up to 10 s (then `{"status": "error"}`). When
  NapCat is not connected, the write raises (the stale socket is closed, or there never was one) and
  the exception leaves the handler: maim_message's client runs handlers in tasks it gathers with
  `return_exceptions=True`, so the frame is gone without a trace. Only on `status: ok` does the
  adapter send `message_id_echo` with content {"type": "echo", "echo": <our message_id>,
  "actual_id": <NapCat's message_id>}; otherwise it logs a warning and says nothing.
- main.py: the adapter dials us (mmc_start_com) at start, whether or not NapCat (a client of the
  adapter) is connected to it yet, and tells us nothing when NapCat connects (lifecycle and heartbeat
  meta events are only logged). A frame that comes before NapCat does raises on the missing socket
  (AttributeError on None) and is gone as above: nothing is queued for NapCat's return, nothing echoed.
- NapCat answers a send once QQ's server took it, which can take a while (`answer_delay`); the echo
  waits for that answer, so an adapter stopped meanwhile (a restart) loses the echo of a message its
  NapCat delivered.
- Reconnects: the maim_message 0.6.8 client reconnects by itself (2 s after a lost connection, then
  doubling to 10 s; its Router re-creates a client it finds disconnected every 5 s). NapCat, a client
  of the adapter, comes back 1.4–2.1 s after the adapter restarts (measured, issue 12): the tests bring
  the platform side up and down explicitly (`napcat.up`), when the scenario says.

The real adapter is run with maim_message 0.7.5 (Socket.IO); this stand-in uses the 0.6.8 client in the
test process, which the same server serves on the same path (the send-handler behaviour above does not
depend on the wire version).

Run as a script (`python -m tests.chat.napcat_standin WS_URL PLATFORM`) it serves with NapCat up and
prints one JSON line per event ({"event": "connected"}, {"event": "delivered", ...}): the frozen-adapter
test stops that process with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("napcat_standin")

# src/response_pool.py: get_response(request_id, timeout=10).
NAPCAT_RESPONSE_TIMEOUT = 10.0


class NapCatGone(ConnectionError):
    """What writing to NapCat raises while it is not connected (websockets' ConnectionClosed, or
    AttributeError on a socket that never was, in the real adapter)."""


@dataclass
class Delivered:
    """One message NapCat accepted: what the QQ user sees."""

    action: str
    target: Any
    message: list[dict]
    message_id: int
    at: float = field(default_factory=time.time)  # when NapCat accepted it (wall clock)


@dataclass
class NapCat:
    """The platform side: answers send_private_msg / send_group_msg as NapCat does, when connected.

    One NapCat (one QQ account: what its users see) may serve one adapter after another: a test that
    restarts the adapter passes the same NapCat to the new stand-in and takes it down (`up = False`:
    its socket to the old adapter closed) until it reconnects."""

    up: bool = True
    # Delivers but its answer never comes (the adapter times out after 10 s and echoes nothing): an echo
    # lost although the user got the message.
    answers: bool = True
    # Seconds between accepting an action and its answer reaching the adapter (NapCat answers a send
    # once QQ's server took it). An answer due over a socket that closed meanwhile (NapCat went down, or
    # the adapter process was stopped: the stand-in cancels its handlers) never arrives.
    answer_delay: float = 0.0
    delivered: list[Delivered] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1_000_001))
    # Counts NapCat's connections to an adapter: an answer goes over the one its request came on.
    link: int = 0

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "up" and value and not getattr(self, "up", True):
            object.__setattr__(self, "link", self.link + 1)  # reconnected: a new socket
        object.__setattr__(self, name, value)

    async def call(self, action: str, params: dict) -> dict:
        if not self.up:
            raise NapCatGone("no connection from NapCat")
        link = self.link
        message_id = next(self._ids)
        target = params.get("group_id", params.get("user_id"))
        self.delivered.append(Delivered(action, target, params["message"], message_id))
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        if not self.answers or not self.up or self.link != link:
            await asyncio.Event().wait()  # never answered; the caller's timeout ends the wait
        return {"status": "ok", "retcode": 0, "data": {"message_id": message_id}, "echo": "request-uuid"}

    def texts(self) -> list[str]:
        """The text of each delivered message, in delivery order."""
        return ["".join(part["data"]["text"] for part in d.message if part["type"] == "text") for d in self.delivered]


def napcat_segments(seg) -> list[dict]:
    """send_message_handler.process_seg_recursive, for the segment types our server sends."""
    parts = seg.data if seg.type == "seglist" else [seg]
    out: list[dict] = []
    for part in parts or []:
        if part.type == "reply":
            if part.data != "notice":
                out = [{"type": "reply", "data": {"id": part.data}}] + [p for p in out if p["type"] != "reply"]
        elif part.type == "text":
            if part.data:
                out.append({"type": "text", "data": {"text": part.data}})
        elif part.type in ("image", "emoji"):
            out.append({"type": "image", "data": {"file": f"base64://{part.data}"}})
        elif part.type == "imageurl":
            out.append({"type": "image", "data": {"file": part.data}})
        elif part.type == "face":
            out.append({"type": "face", "data": {"id": int(part.data)}})
        # Anything else (`at` among them) is dropped, as the real handler does.
    return out


class NapCatStandIn:
    """The adapter: the real maim_message 0.6.8 Router towards us, a NapCat behind it."""

    def __init__(self, base: str, *, platform: str = "qq", napcat: NapCat | None = None) -> None:
        from maim_message import RouteConfig, Router, TargetConfig

        from tests.chat.gateway_helpers import ws_url

        self.platform = platform
        self.napcat = napcat if napcat is not None else NapCat()
        # Every frame our server handed over, as it arrived (before the send handler looked at it).
        self.received: list[dict] = []
        # (reason, our message id) for each frame the send handler dropped without a word.
        self.dropped: list[tuple[str, str]] = []
        self.router = Router(RouteConfig(route_config={platform: TargetConfig(url=ws_url(base), token=None)}))
        self.router.register_class_handler(self.handle_message)
        self._task: asyncio.Task | None = None
        # The send handlers running (each frame's, in a task of maim_message's client).
        self._handlers: set[asyncio.Task] = set()

    # --- lifecycle
    async def start(self, timeout: float = 20.0) -> NapCatStandIn:
        from tests.conftest import wait_for_async

        self._task = asyncio.create_task(self.router.run())

        async def connected() -> bool:
            return self.router.check_connection(self.platform)

        await wait_for_async(connected, timeout=timeout, what="the stand-in adapter to connect")
        return self

    async def stop(self) -> None:
        """The adapter process ends: what its handlers were doing (an answer awaited from NapCat, the
        echo after it) ends with it."""
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self.router.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # --- main_send_handler.SendHandler
    async def handle_message(self, raw: dict) -> None:
        from maim_message import MessageBase

        self.received.append(raw)
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            message = MessageBase.from_dict(raw)
            if message.message_segment.type == "command":
                await self._send_command(message)
            else:
                await self._send_normal_message(message)
        finally:
            self._handlers.discard(task)

    async def _send_normal_message(self, message) -> None:
        info = message.message_info
        our_id = str(info.message_id)
        processed = napcat_segments(message.message_segment)
        if not processed:
            logger.critical("现在暂时不支持解析此回复！")
            self.dropped.append(("unparsable", our_id))
            return
        if info.group_info and info.user_info:
            action, id_name, target = "send_group_msg", "group_id", info.group_info.group_id
        elif info.user_info:
            action, id_name, target = "send_private_msg", "user_id", info.user_info.user_id
        else:
            logger.error("无法识别的消息类型")
            self.dropped.append(("无法识别的消息类型", our_id))
            return
        try:
            response = await self._napcat(action, {id_name: target, "message": processed})
        except NapCatGone:
            self.dropped.append(("napcat_down", our_id))
            raise  # as in the real adapter: out of the handler, swallowed by maim_message
        if response.get("status") == "ok":
            await self.router.send_custom_message(
                info.platform,
                "message_id_echo",
                {"type": "echo", "echo": info.message_id, "actual_id": response["data"]["message_id"]},
            )
        else:
            logger.warning("消息发送失败，napcat返回：%s", response)
            self.dropped.append(("napcat_refused", our_id))

    async def _send_command(self, message) -> None:
        data = message.message_segment.data if isinstance(message.message_segment.data, dict) else {}
        name = data.get("name", "UNKNOWN")
        response = await self._napcat(name, data.get("args") or {})
        payload = {"command_name": name, "success": response.get("status") == "ok", "timestamp": time.time()}
        await self.router.send_custom_message(message.message_info.platform, "command_response", payload)

    async def _napcat(self, action: str, params: dict) -> dict:
        try:
            return await asyncio.wait_for(self.napcat.call(action, params), NAPCAT_RESPONSE_TIMEOUT)
        except TimeoutError:
            logger.error("发送消息超时，未收到响应")
            return {"status": "error", "message": "timeout"}

    # --- what the tests look at
    def received_ids(self) -> list[str]:
        return [str(frame["message_info"]["message_id"]) for frame in self.received]


async def _main(url: str, platform: str) -> None:
    """Script mode: serve with NapCat up, print events as JSON lines."""
    base = url.removesuffix("/ws").replace("ws://", "http://")
    standin = NapCatStandIn(base, platform=platform)
    original = standin.napcat.call

    async def reported(action: str, params: dict) -> dict:
        response = await original(action, params)
        print(json.dumps({"event": "delivered", "message_id": response["data"]["message_id"]}), flush=True)
        return response

    standin.napcat.call = reported
    await standin.start(timeout=60)
    print(json.dumps({"event": "connected"}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(_main(sys.argv[1], sys.argv[2]))
