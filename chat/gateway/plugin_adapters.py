"""Adapter plugins' message gateways as adapter connections of this process's gateway: what the plugin host
(plugins.gateways, a layer above) uses so that a plugin that dials its platform itself (the NapCat adapter
plugin) is served exactly like a maim_message adapter on /ws.

- A gateway that reports itself ready becomes a `PluginGatewayConnection` of its platform in the gateway's
  registry (chat.gateway.connections.Connections): recorded (`AdapterConnection`, protocol "plugin": the
  dashboard and /healthz show it), replacing the platform's earlier connection, its account learned as the
  bot's (chat.accounts), the outbox's rows of its platform handed to it through the delivery gate.
- A hand-over is a call of the gateway component (`call`, given by the plugin host) whose answer is the row's
  fate (chat.outbox_rows.Answered): delivered with the platform's id, or failed with the reason.
- An inbound message it routes is a maim_message envelope (built by the plugin host from MessageDict): parsed
  and checked like a /ws frame (chat.wire.inbound), refused when it names another platform, when the
  connection is no longer its platform's, past the flood guard (`gateway.max_backlog`: refused, not closed:
  the plugin cannot be reconnected by us), or when its dedupe key was seen within DEDUPE_SECONDS; otherwise
  queued for the ingest writer, which stores it and wakes the planner as for any adapter.

Everything here runs on the gateway's event loop (the ASGI server's); `on_gateway` carries a call there from
the plugin host's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from chat.accounts import bot_account_learn
from chat.gateway.connections import CLOSE_NORMAL, Connection
from chat.gateway.gateway import Gateway, running_gateway
from chat.ingest import InboundItem
from chat.outbox_rows import WEB_PLATFORM, Answered
from chat.wire.inbound import EnvelopeError, claimed_platforms, parse_envelope
from core.aio import db
from core.config import get_config

logger = logging.getLogger(__name__)

T = TypeVar("T")

# An inbound message whose dedupe key was routed within this many seconds is refused (as MaiBot's
# platform IO does: a plugin that resends after a restart, two routes of one event).
DEDUPE_SECONDS = 300.0
DEDUPE_KEYS = 10_000  # per platform, the least recently seen forgotten first

GatewayCall = Callable[[dict[str, Any]], Awaitable[Answered]]


class GatewayUnavailable(RuntimeError):
    """This process serves no gateway (no ASGI server runs in it)."""


class PluginGatewayConnection(Connection):
    """A platform's adapter that is an adapter plugin's message gateway. `call(frame)` runs the gateway
    component with the row's envelope and gives its answer; `accept`: the segment types it is handed.
    `sends` False (a receive-only gateway): it only routes inbound messages, and never becomes its
    platform's connection (not recorded; the platform's rows go to whichever adapter sends)."""

    protocol = "plugin"

    def __init__(
        self, *, platform: str, remote: str, account: str, accept: list[str], call: GatewayCall, sends: bool = True
    ) -> None:
        self.platform, self.remote, self.account, self.accept, self.call = platform, remote, account, accept, call
        self.sends = sends
        self.dedupe: OrderedDict[str, float] = OrderedDict()

    async def send(self, frame: dict[str, Any]) -> bool:
        return False  # never written as a frame: hand_over calls the gateway

    async def hand_over(self, frame: dict[str, Any]) -> bool | Answered:
        if self.closed:
            return False
        return await self.call(frame)

    async def close(self, code: int) -> None:
        # A newer connection of the platform replaced it: it takes no more rows nor messages (the plugin
        # is told so when it routes one); the plugin's own link to its platform is its business.
        if not self.closed:
            self.closed = True
            self.close_code = code

    def seen(self, key: str) -> bool:
        """Whether `key` was routed within DEDUPE_SECONDS (and note it now)."""
        now = time.monotonic()
        while self.dedupe and next(iter(self.dedupe.values())) < now - DEDUPE_SECONDS:
            self.dedupe.popitem(last=False)
        if key in self.dedupe:
            return True
        self.dedupe[key] = now
        if len(self.dedupe) > DEDUPE_KEYS:
            self.dedupe.popitem(last=False)
        return False


async def on_gateway(work: Callable[[Gateway], Awaitable[T]]) -> T:
    """`work(gateway)` on this process's gateway loop, awaited from any loop; GatewayUnavailable when no
    gateway runs here."""
    gateway = running_gateway()
    if gateway is None or gateway.loop is None or gateway.loop.is_closed():
        raise GatewayUnavailable("no adapter gateway runs in this process")
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is gateway.loop:
        return await work(gateway)
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(gateway), gateway.loop))


async def plugin_gateway_connect(conn: PluginGatewayConnection) -> None:
    """The gateway is ready: it becomes its platform's connection (recorded, the earlier one replaced),
    takes the platform's rows from now on, and its account is the bot's on that platform."""
    if conn.platform == WEB_PLATFORM:
        raise ValueError(f"platform {WEB_PLATFORM} is the browser chat's, not an adapter's")

    async def connect(gateway: Gateway) -> None:
        connections = gateway.connections
        await connections.adapter_connected(conn)
        if not conn.closed:
            connections.accept[conn.platform] = conn.accept  # replaced whole (readers hold the old list)

    if conn.sends:
        await on_gateway(connect)
    if conn.account:
        try:
            await db(bot_account_learn)(conn.platform, conn.account)
        except Exception:
            logger.exception("the bot's %s account could not be recorded", conn.platform)


async def plugin_gateway_disconnect(conn: PluginGatewayConnection) -> None:
    """The gateway is no longer ready (or its plugin went): its rows wait for the platform's next
    connection."""

    conn.closed = conn.closed or not conn.sends  # a receive-only gateway has no record to close
    if not conn.sends:
        return

    async def disconnect(gateway: Gateway) -> None:
        connections = gateway.connections
        await connections.adapter_disconnected(conn, CLOSE_NORMAL)
        if connections.accept.get(conn.platform) is conn.accept:
            del connections.accept[conn.platform]  # a websocket adapter next starts with what it told us

    await on_gateway(disconnect)


async def plugin_gateway_route(
    conn: PluginGatewayConnection, envelope: dict[str, Any], *, dedupe_key: str, mentioned: bool
) -> str:
    """An inbound message the gateway received, as a maim_message envelope: queued for storage, waking its
    chat's planner once stored; "" when it was, else why it was refused (the message is not stored).
    `mentioned`: the gateway says the message addresses the bot."""
    try:
        message = await asyncio.to_thread(parse_envelope, envelope)  # megabytes of media are checked too
    except EnvelopeError as exc:
        return f"not a message: {exc}"
    claimed = claimed_platforms(envelope, message, api_server=False)
    if others := claimed - {conn.platform}:
        return f"it names platform {', '.join(sorted(others))[:200]}, not its gateway's {conn.platform}"

    async def route(gateway: Gateway) -> str:
        if conn.closed or (conn.sends and gateway.connections.adapters.get(conn.platform) is not conn):
            return f"this gateway is no longer platform {conn.platform}'s connection (another adapter replaced it)"
        limit = get_config().gateway.max_backlog
        if conn.backlog >= limit:
            logger.error("flood from %r: %d messages waiting to be stored (limit %d)", conn, conn.backlog, limit)
            return f"{conn.backlog} messages of this gateway wait to be stored (gateway.max_backlog {limit})"
        if dedupe_key and conn.seen(dedupe_key):
            return f"a duplicate of a message routed within {DEDUPE_SECONDS:g}s ({dedupe_key[:64]})"
        item = InboundItem(platform=conn.platform, message=message, received_at=time.time(), mentioned=mentioned)
        gateway.frames.enqueue_message(conn, item)
        return ""

    return await on_gateway(route)
