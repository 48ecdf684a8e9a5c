"""The adapter gateway: maim_message websockets at /ws (0.6.x plain websocket and 0.7.x Socket.IO), the
registry of live connections (adapters and browser chat pages), batched ingest, and outbox delivery.

One `Gateway` per ASGI process, started on the first ASGI call (daphne has no lifespan events). Frames
are parsed on the event loop and queued; one writer task stores whatever has accumulated in one
transaction (a lone message is written at once, a burst in batches). Outbound rows are delivered by
chat.outbox.Deliverer through this registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import socketio
from django.conf import settings
from django.db import connection

from chat import outbox
from chat.envelope import EnvelopeError, is_custom_message, parse_custom, parse_envelope
from chat.ingest import (
    AdapterFrames,
    InboundItem,
    adapter_connection_close,
    adapter_connection_open,
    adapter_connection_set_accept_format,
    adapter_frames_store,
)
from chat.models import Message
from chat.outbox import WEB_PLATFORM, Deliverer, Delivery, _db_call
from chat.services import inbound_stored
from maibot.config import get_config

logger = logging.getLogger(__name__)

ADAPTER_PATHS = ("/ws", "/ws/")
MAX_FRAME_BYTES = 100 * 1024 * 1024  # as the reference server; daphne is started with the same limit
THREAD_PARSE_BYTES = 256 * 1024  # bigger frames are parsed off the event loop
INGEST_BATCH = 2000
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008


def close_old_connection() -> None:
    connection.close()


# --- connections ----------------------------------------------------------------------------------


class Connection:
    """A live socket this process can write frames to."""

    platform: str = ""
    protocol: str = ""
    remote: str = ""
    closed: bool = False
    # Frames queued for storage but not stored yet: the flood guard.
    backlog: int = 0
    record_id: int | None = None
    # The code we closed it with (replaced, flood, bad token), which is what the record keeps.
    close_code: int | None = None

    async def send(self, frame: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def close(self, code: int) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.protocol} {self.platform} {self.remote}>"


class PlainAdapterConnection(Connection):
    """maim_message ≤ 0.6.x: a plain websocket carrying JSON text frames."""

    protocol = "ws"

    def __init__(self, *, platform: str, remote: str, send) -> None:
        self.platform, self.remote, self._send = platform, remote, send

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed:
            return False
        await self._send({"type": "websocket.send", "text": json.dumps(frame, ensure_ascii=False)})
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


# --- auth -----------------------------------------------------------------------------------------


def _is_loopback(host: str | None) -> bool:
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False


def adapter_auth_problem(*, platform: str | None, token: str | None, client_host: str | None) -> str | None:
    """Why an adapter may not connect, or None. Tokens from MAIBOT_ADAPTER_TOKENS; none → loopback only."""
    if not platform:
        return "missing `platform` header"
    if platform == WEB_PLATFORM:
        return "platform `web` is reserved for the browser chat page"
    tokens = settings.MAIBOT_ADAPTER_TOKENS
    if tokens:
        given = (token or "").strip()
        if given.lower().startswith("bearer "):
            given = given[7:].strip()
        if not given or not any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens):
            return "invalid or missing token"
        return None
    if not _is_loopback(client_host):
        return "no adapter tokens configured: only loopback adapters are accepted"
    return None


# --- the gateway ----------------------------------------------------------------------------------


@dataclass
class _Queued:
    conn: Connection
    kind: str  # message | receipt | command_response
    payload: Any


class Gateway(outbox.Sink):
    def __init__(self) -> None:
        self.adapters: dict[str, Connection] = {}
        self.browsers: dict[str, set[BrowserConnection]] = {}
        self.accept: dict[str, list[str]] = {}
        self.started = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel_name = ""
        self._channel_ready: asyncio.Event | None = None
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        # One thread, one database connection, for the writer's batches and connection records.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest")
        self._store = _db_call(self._executor, adapter_frames_store)
        self._open = _db_call(self._executor, adapter_connection_open)
        self._close = _db_call(self._executor, adapter_connection_close)
        self._set_accept = _db_call(self._executor, adapter_connection_set_accept_format)
        self.deliverer = Deliverer(self)
        self.stored_total = 0

    # --- lifecycle
    def ensure_started(self) -> None:
        if self.started:
            return
        self.started = True
        self.loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.ensure_future(self._writer()))
        self._tasks.append(asyncio.ensure_future(self.deliverer.run()))
        if settings.REDIS_URL:
            self._channel_ready = asyncio.Event()
            self._tasks.append(asyncio.ensure_future(self._listen()))
        outbox.set_deliverer(self.deliverer)
        logger.info("gateway started (outbox %s)", "woken via Redis" if settings.REDIS_URL else "polled")

    async def aclose(self) -> None:
        """Stop the tasks and release the database connections of the gateway's threads."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        outbox.set_deliverer(None)
        for executor in (self._executor, self.deliverer.executor):
            await asyncio.wrap_future(executor.submit(close_old_connection))
            executor.shutdown(wait=False)

    async def _listen(self) -> None:
        """With Redis: outbox wake-ups from other processes, and `close` for replaced connections."""
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        self.channel_name = await layer.new_channel("gateway.")
        last_join = 0.0
        while True:
            try:
                if time.monotonic() - last_join > 600:  # group membership expires in channels_redis
                    await layer.group_add(outbox.OUTBOX_GROUP, self.channel_name)
                    last_join = time.monotonic()
                    self._channel_ready.set()
                message = await layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                await asyncio.sleep(1)
                continue
            if message.get("type") == "outbox.wake":
                self.deliverer.wake()
            elif message.get("type") == "gateway.close":
                for conn in list(self.adapters.values()):
                    if conn.record_id == message.get("record_id"):
                        logger.info("closing %r: replaced by a connection in another process", conn)
                        await conn.close(CLOSE_NORMAL)

    # --- adapters
    async def adapter_connected(self, conn: Connection) -> None:
        if self._channel_ready is not None and not self._channel_ready.is_set():
            # The record must name this process's channel, or a later replacement elsewhere cannot
            # reach this socket; the first connection can arrive before the channel exists.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._channel_ready.wait(), 5)
        old = self.adapters.get(conn.platform)
        self.adapters[conn.platform] = conn
        if old is not None and old is not conn:
            logger.warning("%r replaces the previous connection of platform %s (closed 1000)", conn, conn.platform)
            await old.close(CLOSE_NORMAL)
        record_id, accept, elsewhere = await self._open(
            platform=conn.platform, protocol=conn.protocol, remote=conn.remote, channel_name=self.channel_name
        )
        conn.record_id = record_id
        if conn.closed:  # gone while it was being recorded: its disconnect found no record to close
            await self._close(record_id=record_id, close_code=conn.close_code)
            return
        if accept and conn.platform not in self.accept:
            self.accept[conn.platform] = accept
        if elsewhere and settings.REDIS_URL:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            for other_id, channel in elsewhere:
                await layer.send(channel, {"type": "gateway.close", "record_id": other_id})
        logger.info("adapter %r connected", conn)
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

    # --- inbound frames
    async def frame_text(self, conn: Connection, text: str) -> None:
        """A text frame from a 0.6.x adapter: JSON, then as frame_data."""
        try:
            if len(text) > THREAD_PARSE_BYTES:
                data = await asyncio.to_thread(json.loads, text)
            else:
                data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            logger.warning("frame from %r dropped: not JSON (%s; %d bytes)", conn, str(exc)[:120], len(text))
            return
        await self.frame_data(conn, data)

    async def frame_data(self, conn: Connection, data: Any) -> None:
        """A decoded frame: a chat message envelope or a custom message (receipt, command result)."""
        if conn.closed:
            return
        if not isinstance(data, dict):
            logger.warning("frame from %r dropped: expected a JSON object, got %s", conn, type(data).__name__)
            return
        limit = get_config().gateway.max_backlog
        if conn.backlog >= limit:
            logger.error(
                "flood from %r: %d frames waiting to be stored (limit %d); closing with %d",
                conn,
                conn.backlog,
                limit,
                CLOSE_POLICY,
            )
            await conn.close(CLOSE_POLICY)
            return
        try:
            if is_custom_message(data):
                custom = parse_custom(data)
                if custom.message_type_name == "message_id_echo":
                    self._enqueue(conn, "receipt", custom.content)
                elif custom.message_type_name == "command_response":
                    self._enqueue(conn, "command_response", custom.content)
                else:
                    logger.info("custom message %r from %r ignored", custom.message_type_name, conn)
                return
            message = parse_envelope(data)
        except EnvelopeError as exc:
            logger.warning("frame from %r dropped: %s", conn, exc)
            return
        fmt = message.info.format_info
        if fmt is not None and fmt.accept_format and self.accept.get(conn.platform) != fmt.accept_format:
            self.accept[conn.platform] = list(fmt.accept_format)
            if conn.record_id is not None:
                task = asyncio.ensure_future(self._remember_accept(conn.record_id, list(fmt.accept_format)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        self._enqueue(conn, "message", InboundItem(platform=conn.platform, message=message, received_at=time.time()))

    def enqueue_message(self, conn: Connection, item: InboundItem) -> None:
        """For the browser chat: a message already parsed."""
        self._enqueue(conn, "message", item)

    def _enqueue(self, conn: Connection, kind: str, payload: Any) -> None:
        conn.backlog += 1
        self._queue.put_nowait(_Queued(conn, kind, payload))

    async def _remember_accept(self, record_id: int, accept: list[str]) -> None:
        try:
            await self._set_accept(record_id=record_id, accept_format=accept)
        except Exception:
            logger.exception("could not record accept_format")

    async def _writer(self) -> None:
        while True:
            batch = [await self._queue.get()]
            # Whatever piled up while the previous batch was being written goes in one transaction.
            while len(batch) < INGEST_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            frames = AdapterFrames()
            for q in batch:
                if q.kind == "message":
                    frames.messages.append(q.payload)
                elif q.kind == "receipt":
                    frames.receipts.append((q.conn.platform, q.payload))
                else:
                    frames.command_responses.append((q.conn.platform, q.payload))
            try:
                # Retries through a database outage happen inside; bad rows are dropped one by one there.
                result = await self._store(frames=frames)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("storing %d adapter frames failed", len(batch))
                result = None
            for q in batch:
                q.conn.backlog -= 1
            if result is None or not result.stored:
                continue
            self.stored_total += len(result.stored)
            await self._after_store(batch, result.stored)

    async def _after_store(self, batch: list[_Queued], stored: list[Message]) -> None:
        # The browser page shows its own message as stored once it is.
        by_uid = {id(q.payload): q for q in batch if q.kind == "message"}
        for message in stored:
            origin = getattr(message, "inbound_item", None)
            q = by_uid.get(id(origin)) if origin is not None else None
            if q is not None and isinstance(q.conn, BrowserConnection):
                try:
                    await q.conn.send(outbox.browser_frame(message))
                except Exception:
                    logger.debug("browser went away before its message was confirmed", exc_info=True)
        for receiver, result in await inbound_stored.asend_robust(sender=Message, messages=stored):
            if isinstance(result, Exception):
                logger.error("inbound_stored listener %r failed: %s", receiver, result, exc_info=result)

    # --- outbox.Sink
    def adapter_platforms(self):
        return list(self.adapters)

    def web_users(self):
        return list(self.browsers)

    def accept_formats(self):
        return self.accept

    async def deliver(self, delivery: Delivery) -> bool:
        if delivery.platform == WEB_PLATFORM:
            ok = False
            for conn in list(self.browsers.get(delivery.user_id, ())):
                try:
                    ok = await conn.send(delivery.frame) or ok
                except Exception:
                    logger.debug("browser socket failed", exc_info=True)
            return ok
        conn = self.adapters.get(delivery.platform)
        if conn is None:
            return False
        try:
            return await conn.send(delivery.frame)
        except Exception as exc:
            logger.warning("writing to %r failed: %s", conn, exc)
            return False


_gateway: Gateway | None = None


def get_gateway() -> Gateway:
    """This process's gateway, created and started in the running event loop on first use (a new
    loop, as each in-process test has, gets a new gateway: tasks cannot outlive their loop)."""
    global _gateway
    loop = asyncio.get_running_loop()
    if _gateway is None or _gateway.loop is not loop:
        _gateway = Gateway()
    _gateway.ensure_started()
    return _gateway


# --- 0.6.x: plain websocket -----------------------------------------------------------------------


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def plain_adapter_app(scope, receive, send) -> None:
    """ASGI app for maim_message ≤ 0.6.x at /ws: accept, authenticate (bad token → close 1008), serve."""
    gateway = get_gateway()
    event = await receive()
    if event["type"] != "websocket.connect":
        return
    headers = _headers(scope)
    client = scope.get("client") or ("", 0)
    platform = headers.get("platform", "").strip()
    await send({"type": "websocket.accept"})
    problem = adapter_auth_problem(platform=platform, token=headers.get("authorization"), client_host=client[0])
    if problem:
        logger.warning("adapter connection from %s (platform %r) refused: %s", client[0], platform, problem)
        await send({"type": "websocket.close", "code": CLOSE_POLICY})
        return
    conn = PlainAdapterConnection(platform=platform, remote=f"{client[0]}:{client[1]}", send=send)
    await gateway.adapter_connected(conn)
    code = None
    try:
        while True:
            event = await receive()
            kind = event["type"]
            if kind == "websocket.receive":
                text = event.get("text")
                if text is None:
                    raw = event.get("bytes") or b""
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        logger.warning("binary frame from %r dropped: not UTF-8 JSON", conn)
                        continue
                await gateway.frame_text(conn, text)
            elif kind == "websocket.disconnect":
                code = event.get("code")
                break
    finally:
        await gateway.adapter_disconnected(conn, code)


# --- 0.7.x: Socket.IO -----------------------------------------------------------------------------

sio = socketio.AsyncServer(
    async_mode="asgi",
    # Adapters are not browsers; no Origin header to check.
    cors_allowed_origins=[],
    max_http_buffer_size=MAX_FRAME_BYTES,
    # Handlers run one at a time per server so a connection's frames are stored in order.
    async_handlers=False,
    logger=False,
    engineio_logger=False,
)
_sio_conns: dict[str, SocketIOAdapterConnection] = {}


@sio.event
async def connect(sid: str, environ: dict, auth: Any = None) -> None:
    gateway = get_gateway()
    scope = environ.get("asgi.scope") or {}
    client = scope.get("client") or ("", 0)
    platform = (environ.get("HTTP_PLATFORM") or "").strip()
    problem = adapter_auth_problem(platform=platform, token=environ.get("HTTP_AUTHORIZATION"), client_host=client[0])
    if problem:
        logger.warning("Socket.IO adapter from %s (platform %r) refused: %s", client[0], platform, problem)
        raise socketio.exceptions.ConnectionRefusedError(problem)
    conn = SocketIOAdapterConnection(platform=platform, remote=f"{client[0]}:{client[1]}", sid=sid, server=sio)
    _sio_conns[sid] = conn
    await gateway.adapter_connected(conn)


@sio.event
async def disconnect(sid: str, reason: Any = None) -> None:
    conn = _sio_conns.pop(sid, None)
    if conn is not None:
        await get_gateway().adapter_disconnected(conn, None)


@sio.on("message")
async def message(sid: str, data: Any) -> None:
    conn = _sio_conns.get(sid)
    if conn is None:
        return
    gateway = get_gateway()
    if isinstance(data, str | bytes):
        await gateway.frame_text(conn, data.decode("utf-8", "replace") if isinstance(data, bytes) else data)
    else:
        await gateway.frame_data(conn, data)


socketio_app = socketio.ASGIApp(sio, socketio_path="ws")


# --- the project's ASGI application ---------------------------------------------------------------


def _allow_protocol_close_codes() -> None:
    """Let the application close websockets with RFC 6455 codes such as 1008 (policy violation).

    The wire protocol needs 1008 for a bad token, but autobahn's public sendClose (which daphne calls)
    accepts only 1000 and 3000–4999 from applications. Its sendCloseFrame sends any code.
    """
    if "daphne.ws_protocol" not in sys.modules:
        return
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol, "_maibot_close_codes", False):
        return
    original = WebSocketProtocol.serverClose

    def server_close(self, code=None):
        if code is not None and 1000 < code < 3000 and code not in (1005, 1006, 1015):
            self.sendCloseFrame(code=code, isReply=False)
        else:
            original(self, code=code)

    WebSocketProtocol.serverClose = server_close
    WebSocketProtocol._maibot_close_codes = True


class GatewayRouter:
    """Front ASGI app: /ws goes to the adapter gateway (Socket.IO when the query carries EIO=, including
    its HTTP long-polling requests; the plain websocket otherwise); everything else to Django."""

    def __init__(self, *, http, websocket) -> None:
        self.http, self.websocket = http, websocket
        _allow_protocol_close_codes()
        if not settings.MAIBOT_ADAPTER_TOKENS:
            logger.warning("MAIBOT_ADAPTER_TOKENS is not set: adapters are accepted from loopback addresses only")

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            return
        get_gateway()
        if scope.get("path") in ADAPTER_PATHS:
            if "EIO" in parse_qs(scope.get("query_string", b"").decode("latin-1")):
                return await socketio_app(scope, receive, send)
            if kind == "websocket":
                return await plain_adapter_app(scope, receive, send)
        if kind == "http":
            return await self.http(scope, receive, send)
        return await self.websocket(scope, receive, send)
