"""What a frame from an adapter becomes: parsed, checked (a JSON object, its own platform's, within the
flood guard), acknowledged in API-Server mode, and queued for the ingest writer as a message, a
receipt or a command's result.

A plain (legacy-mode) 0.6.x frame is queued as its text and decoded by the writer just before its
batch is stored (`decode_text`): a flood's backlog is then strings, which the garbage collector never
walks, not parsed objects (measurements: docs/benchmarks.md, `bench/ingest.py`). API-Server frames
are decoded on receipt (each is acknowledged at once), and so are frames too big to decode on the
event loop (THREAD_PARSE_BYTES: parsed in a thread).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from chat.gateway.apiserver import ApiServerReceipts
from chat.gateway.connections import CLOSE_POLICY, Connection, Connections
from chat.gateway.writer import FrameKind, IngestWriter
from chat.ingest import InboundItem
from chat.wire.inbound import (
    CustomMessage,
    EnvelopeError,
    InboundMessage,
    claimed_platforms,
    is_custom_message,
    json_text_is_storable,
    parse_api_package,
    parse_custom,
    parse_envelope,
)
from core.config import get_config

logger = logging.getLogger(__name__)

THREAD_PARSE_BYTES = 256 * 1024  # bigger frames are parsed off the event loop


def _dropped_not_json(conn: Connection, text: str, exc: Exception) -> None:
    logger.warning("frame from %r dropped: not JSON (%s; %d bytes)", conn, str(exc)[:120], len(text))


def _dropped_not_an_object(conn: Connection, data: Any) -> None:
    logger.warning("frame from %r dropped: expected a JSON object, got %s", conn, type(data).__name__)


class FrameReader:
    """Inbound frames of this process's connections, into the ingest writer's queue (which it owns)."""

    def __init__(self, connections: Connections) -> None:
        self.connections = connections
        self.receipts = ApiServerReceipts()
        # Runs the connection records too: one thread, one database connection (Connections.records).
        self.writer = IngestWriter(decode=self.decode_text, executor=connections.records)

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
            await self.receipts.acknowledge(conn, data)
            if self.receipts.seen_before(conn, data):
                return
        decoded = self._decode(conn, data, storable=storable)
        if decoded is not None:
            self.writer.enqueue(conn, *decoded)

    def enqueue_message(self, conn: Connection, item: InboundItem) -> None:
        """For the browser chat: a message already parsed."""
        self.writer.enqueue_message(conn, item)

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
            return self._custom(conn, parsed)
        return FrameKind.MESSAGE, self._message(conn, parsed, received_at)

    def _custom(self, conn: Connection, parsed: CustomMessage) -> tuple[FrameKind, Any] | None:
        if parsed.message_type_name == "message_id_echo":
            if self.connections.gate.echo_seen(conn, parsed.content):
                self.connections.deliverer.wake()
            return FrameKind.RECEIPT, parsed.content
        if parsed.message_type_name == "command_response":
            return FrameKind.COMMAND_RESPONSE, parsed.content
        logger.info("custom message %r from %r ignored", parsed.message_type_name, conn)
        return None

    def _message(self, conn: Connection, message: InboundMessage, received_at: float) -> InboundItem:
        fmt = message.info.format_info
        if fmt is not None and fmt.accept_format:
            self.connections.accept_seen(conn, fmt.accept_format)
        return InboundItem(platform=conn.platform, message=message, received_at=received_at or time.time())
