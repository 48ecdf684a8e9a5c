"""Live sockets this process can write frames to (a 0.6.x plain websocket, a 0.7.x Socket.IO client, a
browser chat page), the websocket close codes the gateway uses, and `Connections`: this process's
registry of them, which is the outbox's Sink."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from concurrent.futures import Executor
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from chat import outbox
from chat.delivery_gate import DeliveryGate
from chat.ingest import adapter_connection_close, adapter_connection_open, adapter_connection_set_accept_format
from chat.notify import GatewayListener, get_notifier
from chat.outbox import Deliverer
from chat.outbox_rows import WEB_PLATFORM, Answered, Delivery
from chat.wire.outbound import api_server_package, plain_text_frame
from core.aio import db

if TYPE_CHECKING:
    import socketio

logger = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008


class Connection:
    """A live socket this process can write frames to."""

    platform: str = ""
    protocol: str = ""
    remote: str = ""
    closed: bool = False
    # Frames queued for storage but not stored yet: the flood guard.
    backlog: int = 0
    record_id: int | None = None
    # maim_message's API-Server mode (chat.gateway.auth): frames both ways travel in its packages, and
    # each frame it sends is acknowledged; `client_uuid` is its `x-uuid` header.
    api_server: bool = False
    client_uuid: str = ""
    # The code we closed it with (replaced, flood, bad token), which is what the record keeps.
    close_code: int | None = None
    # The delivery gate, for a platform whose adapter echoes or may (Connections): when it opened,
    # whether an echo came over it since (or since it last missed a confirm deadline), and the one row
    # handed to it meanwhile.
    opened_at: datetime | None = None
    # Set once the connection is recorded and the platform's echo history read: until then the
    # gateway does not know whether it is gated, so nothing is handed to it.
    ready: bool = False
    proven: bool = False
    probe_id: int | None = None
    # Of a platform not yet known to echo or not, opened after an outage came before it showed which.
    wary: bool = False

    async def send(self, frame: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def hand_over(self, frame: dict[str, Any]) -> bool | Answered:
        """Hand one outbound row's frame over: whether it was written (a socket), or the adapter's
        answer (chat.gateway.plugin_adapters: an adapter plugin's gateway answers every hand-over)."""
        return await self.send(frame)

    async def close(self, code: int) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        mode = " api-server" if self.api_server else ""
        return f"<{self.protocol}{mode} {self.platform} {self.remote}>"


class PlainAdapterConnection(Connection):
    """maim_message ≤ 0.6.x: a plain websocket carrying JSON text frames."""

    protocol = "ws"

    def __init__(self, *, platform: str, remote: str, send) -> None:
        self.platform, self.remote, self._send = platform, remote, send

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed:
            return False
        await self._send({"type": "websocket.send", "text": plain_text_frame(frame)})
        return not self.closed

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self._send({"type": "websocket.close", "code": code})


class SocketIOAdapterConnection(Connection):
    """maim_message ≥ 0.7.0: a Socket.IO client; frames are `message` events."""

    protocol = "socketio"

    def __init__(self, *, platform: str, remote: str, sid: str, server: socketio.AsyncServer) -> None:
        self.platform, self.remote, self.sid, self._server = platform, remote, sid, server

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed or not self._server.manager.is_connected(self.sid, "/"):
            return False
        await self._server.emit("message", frame, to=self.sid)
        return True

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self._server.disconnect(self.sid)


class BrowserConnection(Connection):
    """The operator chat page's socket (platform `web`): a chat.consumers.ChatPageConsumer."""

    protocol = "browser"
    platform = WEB_PLATFORM

    def __init__(self, *, user_id: str, consumer) -> None:
        self.user_id, self.consumer = user_id, consumer

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed:
            return False
        await self.consumer.send_json(frame)
        return True

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self.consumer.close(code=code)


class Connections(outbox.Sink):
    """This process's live connections (adapters by platform, browser pages by user) and their records,
    what each platform accepts, and the outbox's Sink: which platforms and users this process can
    deliver to, and the hand-over of one row.

    Which rows a connection may take (probation until it echoes, confirm deadlines) is the delivery
    gate's (`gate`, chat.delivery_gate); the deliverer asks it, and `deliver` keeps to its answer.
    """

    def __init__(self, records: Executor) -> None:
        self.adapters: dict[str, Connection] = {}
        self.browsers: dict[str, set[BrowserConnection]] = {}
        self.accept: dict[str, list[str]] = {}
        self.gate = DeliveryGate(self.adapters)
        # How other processes reach this one (chat.notify), set while the gateway runs.
        self.listener: GatewayListener | None = None
        # Connection records are written on the ingest writer's thread (one thread, one database
        # connection): `records` is that executor.
        self.records = records
        self._open = db(adapter_connection_open, executor=records)
        self._close = db(adapter_connection_close, executor=records)
        self._set_accept = db(adapter_connection_set_accept_format, executor=records)
        self._background: set[asyncio.Task] = set()
        self.deliverer = Deliverer(self, self.gate)

    @property
    def channel_name(self) -> str:
        """Where other processes reach this gateway (named in its connection records)."""
        return self.listener.channel_name if self.listener is not None else ""

    def close_replaced(self, record_id: Any) -> None:
        """Close the connection of this record: a newer one in another process replaced it."""
        for conn in list(self.adapters.values()):
            if conn.record_id == record_id:
                logger.info("closing %r: replaced by a connection in another process", conn)
                task = asyncio.ensure_future(conn.close(CLOSE_NORMAL))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # --- adapters
    async def adapter_connected(self, conn: Connection) -> None:
        if self.listener is not None:
            # The record must name this process's channel, or a later replacement elsewhere cannot
            # reach this socket; the first connection can arrive before the channel exists.
            if not await self.listener.ready(5):
                logger.warning(
                    "%r connected before this process joined the outbox group (Redis slow or unreachable):"
                    " wake-ups from other processes reach it only once it has; until then the poll delivers",
                    conn,
                )
        conn.opened_at = timezone.now()
        old = self.adapters.get(conn.platform)
        self.adapters[conn.platform] = conn
        if old is not None and old is not conn:
            logger.warning("%r replaces the previous connection of platform %s (closed 1000)", conn, conn.platform)
            await old.close(CLOSE_NORMAL)
        opened = await self._open(
            platform=conn.platform, protocol=conn.protocol, remote=conn.remote, channel_name=self.channel_name
        )
        conn.record_id = opened.record_id
        if conn.closed:  # gone while it was being recorded: its disconnect found no record to close
            await self._close(record_id=opened.record_id, close_code=conn.close_code)
            return
        if opened.accept_format and conn.platform not in self.accept:
            self.accept[conn.platform] = opened.accept_format
        elif conn.platform in self.accept and self.accept[conn.platform] != opened.accept_format:
            # Kept across reconnects: the new connection's record shows what the platform accepts.
            self._remember_accept_soon(opened.record_id, conn.platform, self.accept[conn.platform])
        if opened.elsewhere:
            await get_notifier().close_replaced_elsewhere(opened.elsewhere)
        self.gate.connected(
            conn, echoes=opened.echoes, never_echoes=opened.never_echoes, after_outage=opened.after_outage
        )
        self.deliverer.wake()

    async def adapter_disconnected(self, conn: Connection, code: int | None) -> None:
        conn.closed = True
        code = conn.close_code if conn.close_code is not None else code
        if self.adapters.get(conn.platform) is conn:
            del self.adapters[conn.platform]
        logger.info("adapter %r disconnected (code %s)", conn, code)
        if conn.record_id is not None:
            try:
                await self._close(record_id=conn.record_id, close_code=code)
            except Exception:
                logger.exception("could not record the disconnect of %r", conn)

    # --- browsers
    def browser_connected(self, conn: BrowserConnection) -> None:
        self.browsers.setdefault(conn.user_id, set()).add(conn)
        self.deliverer.wake()

    def browser_disconnected(self, conn: BrowserConnection) -> None:
        conn.closed = True
        conns = self.browsers.get(conn.user_id)
        if conns is not None:
            conns.discard(conn)
            if not conns:
                del self.browsers[conn.user_id]

    def accept_seen(self, conn: Connection, accept: list[str]) -> None:
        """A message over `conn` said what its platform accepts: kept, and recorded when it changed."""
        if self.accept.get(conn.platform) != accept:
            self.accept[conn.platform] = list(accept)
            if conn.record_id is not None:
                self._remember_accept_soon(conn.record_id, conn.platform, list(accept))

    def _remember_accept_soon(self, record_id: int, platform: str, accept: list[str]) -> None:
        task = asyncio.ensure_future(self._remember_accept(record_id, platform, accept))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _remember_accept(self, record_id: int, platform: str, accept: list[str]) -> None:
        try:
            await self._set_accept(record_id=record_id, platform=platform, accept_format=accept)
        except Exception:
            logger.exception("could not record accept_format")

    # --- outbox.Sink
    def web_users(self) -> Collection[str]:
        return list(self.browsers)

    def accept_formats(self) -> dict[str, list[str]]:
        return self.accept  # live: changed only by replacing a platform's list, never in place

    async def deliver(self, delivery: Delivery) -> bool | Answered:
        if delivery.platform == WEB_PLATFORM:
            ok = False
            for conn in list(self.browsers.get(delivery.user_id, ())):
                try:
                    ok = await conn.send(delivery.frame) or ok
                except Exception:
                    logger.debug("browser socket failed", exc_info=True)
            return ok
        conn = self.adapters.get(delivery.platform)
        if conn is None or not conn.ready:
            return False
        if not self.gate.take(conn, delivery.message_id):
            return False
        frame = delivery.frame
        if conn.api_server and frame is not None:
            frame = api_server_package(frame, platform=conn.platform)
        try:
            written = await conn.hand_over(frame)
        except Exception as exc:
            logger.warning("writing to %r failed: %s", conn, exc)
            written = False
        if isinstance(written, Answered):
            if not written.ok:
                self.gate.not_written(conn, delivery.message_id)
            elif self.gate.echo_seen(conn, {"actual_id": written.platform_id or "answered"}):
                self.deliverer.wake()  # an answered success proves the connection as an echo does
        elif not written:
            self.gate.not_written(conn, delivery.message_id)
        return written
