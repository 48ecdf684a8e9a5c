"""The gateway of one ASGI process: the registry of live connections (adapters by platform, browser
pages by user), what a frame from one of them becomes (parsed, checked, queued for the ingest writer),
the outbox's Sink, and, with Redis, the messages other processes send it (outbox wake-ups, `close`
for a connection replaced elsewhere).

Which rows a connection may take (probation until it echoes, confirm deadlines) is the delivery
gate's: chat.delivery_gate.

One `Gateway` per event loop, started on the first ASGI call (daphne has no lifespan events).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from django.conf import settings
from django.utils import timezone

from chat import outbox
from chat.delivery_gate import DeliveryGate
from chat.gateway.connections import CLOSE_NORMAL, CLOSE_POLICY, BrowserConnection, Connection
from chat.gateway.writer import FrameKind, IngestWriter, close_old_connection
from chat.ingest import (
    InboundItem,
    adapter_connection_close,
    adapter_connection_open,
    adapter_connection_set_accept_format,
)
from chat.outbox import WEB_PLATFORM, Deliverer, Delivery, db_call
from chat.wake import WakeEndpoint
from chat.wire.inbound import (
    CustomMessage,
    EnvelopeError,
    claimed_platforms,
    is_custom_message,
    json_text_is_storable,
    parse_api_package,
    parse_custom,
    parse_envelope,
)
from chat.wire.outbound import api_server_ack, api_server_package
from core.aio import wait_event
from core.config import get_config

logger = logging.getLogger(__name__)

THREAD_PARSE_BYTES = 256 * 1024  # bigger frames are parsed off the event loop
# API-Server packages remembered by msg_id, so one the client resends (from its cache, after a reconnect,
# when our ack did not reach it) is not stored twice; maim_message's own server remembers them an hour.
API_SEEN_MAX = 4096
# Group membership expires in channels_redis (group_expiry); the gateway joins again well before.
GROUP_REJOIN_SECONDS = 600
# How long closing the gateway waits for its channel receive to end.
CLOSE_SECONDS = 5.0


def _dropped_not_json(conn: Connection, text: str, exc: Exception) -> None:
    logger.warning("frame from %r dropped: not JSON (%s; %d bytes)", conn, str(exc)[:120], len(text))


def _dropped_not_an_object(conn: Connection, data: Any) -> None:
    logger.warning("frame from %r dropped: expected a JSON object, got %s", conn, type(data).__name__)


class Gateway(outbox.Sink):
    def __init__(self) -> None:
        self.adapters: dict[str, Connection] = {}
        self.browsers: dict[str, set[BrowserConnection]] = {}
        self.accept: dict[str, list[str]] = {}
        self.gate = DeliveryGate(self.adapters)
        # (platform, msg_id) of API-Server packages already taken in, oldest first (API_SEEN_MAX).
        self._api_seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.started = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.channel_name = ""
        self._channel_ready: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._listen_thread: threading.Thread | None = None
        self._listen_loop: asyncio.AbstractEventLoop | None = None
        self._listen_task: asyncio.Task | None = None
        self.writer = IngestWriter(decode=self.decode_text)
        # Connection records are written on the writer's thread (one thread, one database connection).
        self._open = db_call(self.writer.executor, adapter_connection_open)
        self._close = db_call(self.writer.executor, adapter_connection_close)
        self._set_accept = db_call(self.writer.executor, adapter_connection_set_accept_format)
        self.deliverer = Deliverer(self, self.gate)
        self.wake_endpoint: WakeEndpoint | None = None

    @property
    def stored_total(self) -> int:
        return self.writer.stored_total

    # --- lifecycle
    def ensure_started(self) -> None:
        if self.started:
            return
        self.started = True
        self.loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.ensure_future(self.writer.run()))
        self._tasks.append(asyncio.ensure_future(self.deliverer.run()))
        if settings.REDIS_URL:
            self._channel_ready = asyncio.Event()
            self._start_listener()
            how = "woken via Redis"
        else:
            # Without Redis, other local processes that write the outbox wake this one through a socket.
            self.wake_endpoint = WakeEndpoint(self.deliverer.wake)
            how = "woken locally" if self.wake_endpoint.open(self.loop) else "polled"
        outbox.set_deliverer(self.deliverer)
        logger.info("gateway started (outbox %s)", how)

    async def aclose(self) -> None:
        """Stop the tasks and release the database connections of the gateway's threads."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._stop_listener()
        outbox.set_deliverer(None)
        if self.wake_endpoint is not None:
            self.wake_endpoint.close()
            self.wake_endpoint = None
        for executor in (self.writer.executor, self.deliverer.executor):
            await asyncio.wrap_future(executor.submit(close_old_connection))
            executor.shutdown(wait=False)

    # --- with Redis: the gateway's own channel, read on a thread of its own
    #
    # The receive runs on its own event loop, never the server's: a cancellation that arrives while the
    # Redis client (redis-py 8.1 under channels_redis 4.3) waits in its blocking pop is taken in only when
    # that pop returns (channels_redis blocks up to 5 s), and one was seen to be swallowed and waited on
    # for ever, hanging whatever awaited the task. So closing does not cancel first: it sends the receive
    # a `gateway.stop` on its own channel, which ends it at once (leaving the outbox group, so the other
    # processes stop sending wake-ups to a channel nobody reads); only if that cannot be sent, or the
    # receive does not end within CLOSE_SECONDS, is it cancelled on its loop, and a receive that never
    # ends keeps only its own thread.

    def _start_listener(self) -> None:
        # A channel of its own, not one of channels_redis' process-specific ("!") channels: those share
        # one receive loop and buffer per process with the session runtimes' channels, and outbox
        # wake-ups sent to the gateway were lost there while runtimes received too (the chat page test
        # on PostgreSQL + Redis). A plain channel is read with its own blocking pop.
        self.channel_name = f"gateway.{uuid.uuid4().hex}"
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._listen_loop = loop
            self._listen_task = loop.create_task(self._listen())
            started.set()
            # Cancelled at close (anything else the loop logged itself).
            with contextlib.suppress(BaseException):
                loop.run_until_complete(self._listen_task)
            # channels_redis leaves a task clearing the receive's backup queue: it ends before the loop
            # does (closing the loop closes its Redis connections).
            with contextlib.suppress(BaseException):
                if pending := asyncio.all_tasks(loop):
                    loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_SECONDS))
            loop.close()

        self._listen_thread = threading.Thread(target=run, name="gateway-listen", daemon=True)
        self._listen_thread.start()
        started.wait()

    async def _stop_listener(self) -> None:
        thread, loop, task = self._listen_thread, self._listen_loop, self._listen_task
        self._listen_thread = self._listen_loop = self._listen_task = None
        if thread is None or loop is None or task is None:
            return
        from channels.layers import get_channel_layer

        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await get_channel_layer().send(self.channel_name, {"type": "gateway.stop"})
            await asyncio.to_thread(thread.join, CLOSE_SECONDS)
        except Exception:
            logger.warning("could not ask the gateway's channel receive to stop; cancelling it", exc_info=True)
        if not thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):  # its loop has ended already
            loop.call_soon_threadsafe(task.cancel)
        await asyncio.to_thread(thread.join, CLOSE_SECONDS)
        if thread.is_alive():
            logger.warning("the gateway's channel receive did not end within %gs of its cancellation", CLOSE_SECONDS)

    def _in_gateway_loop(self, callback: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the gateway's loop has ended (a test's)
            self.loop.call_soon_threadsafe(callback, *args)

    async def _listen(self) -> None:
        """Outbox wake-ups from other processes, and `close` for replaced connections."""
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        last_join = 0.0
        while True:
            try:
                if time.monotonic() - last_join > GROUP_REJOIN_SECONDS:
                    await layer.group_add(outbox.OUTBOX_GROUP, self.channel_name)
                    last_join = time.monotonic()
                    self._in_gateway_loop(self._channel_ready.set)
                message = await layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                await asyncio.sleep(1)
                continue
            if message.get("type") == "outbox.wake":
                self.deliverer.wake()  # thread-safe
            elif message.get("type") == "gateway.close":
                self._in_gateway_loop(self._close_replaced, message.get("record_id"))
            elif message.get("type") == "gateway.stop":
                with contextlib.suppress(Exception):  # the membership expires anyway (group_expiry)
                    await layer.group_discard(outbox.OUTBOX_GROUP, self.channel_name)
                return

    def _close_replaced(self, record_id: Any) -> None:
        for conn in list(self.adapters.values()):
            if conn.record_id == record_id:
                logger.info("closing %r: replaced by a connection in another process", conn)
                task = asyncio.ensure_future(conn.close(CLOSE_NORMAL))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # --- adapters
    async def adapter_connected(self, conn: Connection) -> None:
        if self._channel_ready is not None and not self._channel_ready.is_set():
            # The record must name this process's channel, or a later replacement elsewhere cannot
            # reach this socket; the first connection can arrive before the channel exists.
            if not await wait_event(self._channel_ready, 5):
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
        if opened.elsewhere and settings.REDIS_URL:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            for other_id, channel in opened.elsewhere:
                await layer.send(channel, {"type": "gateway.close", "record_id": other_id})
        self.gate.connected(conn, echoes=opened.echoes)
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
    #
    # A plain (legacy-mode) 0.6.x frame is queued as its text and decoded by the writer just before its
    # batch is stored (`decode_text`): under a flood the frames waiting for the writer are strings, which
    # the garbage collector never walks, rather than ~17 parsed objects each that live long enough to
    # reach its oldest generation (a burst of 20,000 left ~250,000 of them, and each full collection
    # then paused the event loop 100-250 ms). API-Server frames are decoded on receipt (each is
    # acknowledged at once), and so are frames too big to decode on the event loop.
    async def frame_text(self, conn: Connection, text: str) -> None:
        """A text frame from a 0.6.x adapter: queued as it is for the writer to decode (legacy mode), or
        decoded now and taken as frame_data (API-Server mode, or too big for the event loop)."""
        if conn.closed:
            return
        if not conn.api_server and len(text) <= THREAD_PARSE_BYTES:
            if await self._flooded(conn):
                return
            self.writer.enqueue(conn, FrameKind.TEXT, text)
            return
        try:
            if len(text) > THREAD_PARSE_BYTES:
                data = await asyncio.to_thread(json.loads, text)
            else:
                data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            _dropped_not_json(conn, text, exc)
            return
        await self.frame_data(conn, data, storable=json_text_is_storable(text))

    def decode_text(self, conn: Connection, text: str, received_at: float) -> tuple[FrameKind, Any] | None:
        """For the writer: what a queued plain frame's text, received at `received_at` (epoch seconds),
        becomes (None: dropped, with a warning)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            _dropped_not_json(conn, text, exc)
            return None
        if not isinstance(data, dict):
            _dropped_not_an_object(conn, data)
            return None
        return self._decode(conn, data, storable=json_text_is_storable(text), received_at=received_at)

    async def frame_data(self, conn: Connection, data: Any, *, storable: bool = False) -> None:
        """A decoded frame: a chat message envelope or a custom message (receipt, command result).
        `storable`: its JSON text showed that none of its values can be unstorable (the check of each
        value is skipped)."""
        if conn.closed:
            return
        if not isinstance(data, dict):
            _dropped_not_an_object(conn, data)
            return
        if await self._flooded(conn):
            return
        if conn.api_server:
            await self._acknowledge(conn, data)
            if self._api_seen_before(conn, data):
                return
        decoded = self._decode(conn, data, storable=storable)
        if decoded is not None:
            self.writer.enqueue(conn, *decoded)

    async def _flooded(self, conn: Connection) -> bool:
        """The flood guard: a connection with gateway.max_backlog frames waiting to be stored is closed."""
        limit = get_config().gateway.max_backlog
        if conn.backlog < limit:
            return False
        logger.error(
            "flood from %r: %d frames waiting to be stored (limit %d); closing with %d",
            conn,
            conn.backlog,
            limit,
            CLOSE_POLICY,
        )
        await conn.close(CLOSE_POLICY)
        return True

    def _decode(
        self, conn: Connection, data: dict[str, Any], *, storable: bool, received_at: float = 0.0
    ) -> tuple[FrameKind, Any] | None:
        """What a frame's JSON object is for the writer: a message, a receipt or a command's result
        (None: nothing to store; dropped ones are logged). A connection speaks for its own platform:
        a frame naming another (chat.wire.inbound.claimed_platforms) is dropped."""
        try:
            if conn.api_server:
                parsed = parse_api_package(data)
                if parsed is None:
                    return None  # a system package (sys_ack): nothing for us
            elif is_custom_message(data):
                parsed = parse_custom(data)
            else:
                parsed = parse_envelope(data, storable=storable)
        except EnvelopeError as exc:
            logger.warning("frame from %r dropped: %s", conn, exc)
            return None
        claimed = claimed_platforms(data, parsed, api_server=conn.api_server)
        if claimed and claimed != {conn.platform}:
            others = ", ".join(sorted(claimed - {conn.platform}))[:200]
            logger.warning("frame from %r dropped: it names platform %s, not its connection's", conn, others)
            return None
        if isinstance(parsed, CustomMessage):
            if parsed.message_type_name == "message_id_echo":
                if self.gate.echo_seen(conn, parsed.content):
                    self.deliverer.wake()
                return FrameKind.RECEIPT, parsed.content
            if parsed.message_type_name == "command_response":
                return FrameKind.COMMAND_RESPONSE, parsed.content
            logger.info("custom message %r from %r ignored", parsed.message_type_name, conn)
            return None
        message = parsed
        fmt = message.info.format_info
        if fmt is not None and fmt.accept_format and self.accept.get(conn.platform) != fmt.accept_format:
            self.accept[conn.platform] = list(fmt.accept_format)
            if conn.record_id is not None:
                self._remember_accept_soon(conn.record_id, conn.platform, list(fmt.accept_format))
        item = InboundItem(platform=conn.platform, message=message, received_at=received_at or time.time())
        return FrameKind.MESSAGE, item

    def enqueue_message(self, conn: Connection, item: InboundItem) -> None:
        """For the browser chat: a message already parsed."""
        self.writer.enqueue_message(conn, item)

    async def _acknowledge(self, conn: Connection, data: dict[str, Any]) -> None:
        """An API-Server client expects a `sys_ack` for every frame it sends (but acks) that carries a
        msg_id, as maim_message's own server sends it on receipt: the client resends unacknowledged
        frames from its cache when it reconnects."""
        msg_id = data.get("msg_id")
        if data.get("type") == "sys_ack" or not isinstance(msg_id, str) or not 0 < len(msg_id) <= 256:
            return
        try:
            await conn.send(api_server_ack(msg_id, connection_uuid=conn.client_uuid))
        except Exception as exc:
            logger.debug("acknowledging a frame of %r failed: %s", conn, exc)

    def _api_seen_before(self, conn: Connection, data: dict[str, Any]) -> bool:
        """Whether this API-Server package (by msg_id) was taken in already; remembers it if not."""
        msg_id = data.get("msg_id")
        if data.get("type") == "sys_ack" or not isinstance(msg_id, str) or not msg_id:
            return False
        key = (conn.platform, msg_id[:256])
        if key in self._api_seen:
            logger.info("package %s from %r dropped: received before (resent by the client)", key[1][:64], conn)
            return True
        self._api_seen[key] = None
        if len(self._api_seen) > API_SEEN_MAX:
            self._api_seen.popitem(last=False)
        return False

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
        if conn is None or not conn.ready:
            return False
        if not self.gate.take(conn, delivery.message_id):
            return False
        frame = delivery.frame
        if conn.api_server and frame is not None:
            frame = api_server_package(frame, platform=conn.platform)
        try:
            written = await conn.send(frame)
        except Exception as exc:
            logger.warning("writing to %r failed: %s", conn, exc)
            written = False
        if not written:
            self.gate.not_written(conn, delivery.message_id)
        return written


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
