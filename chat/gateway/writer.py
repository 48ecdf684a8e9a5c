"""The ingest writer: one task per ASGI process that stores the adapter frames queued on the event loop,
whatever accumulated since its last write in one transaction (a lone message is written at once, a
burst in batches), then announces the stored messages (`inbound_stored`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.db import connection

from chat.gateway.connections import BrowserConnection, Connection
from chat.ingest import AdapterFrames, InboundItem, adapter_frames_store
from chat.models import Message
from chat.services import inbound_stored
from chat.wire.outbound import browser_frame
from core.aio import db

logger = logging.getLogger(__name__)

# Frames per transaction at most: bounds one write under a flood (tuned with bench/ingest.py; the
# operator's limit is gateway.max_backlog).
INGEST_BATCH = 2000


def close_old_connection() -> None:
    """Release the calling thread's database connection (run in a thread that is about to be dropped)."""
    connection.close()


class FrameKind(StrEnum):
    # A plain frame's JSON text, decoded (into one of the others, or dropped) just before it is stored.
    TEXT = "text"
    MESSAGE = "message"
    RECEIPT = "receipt"
    COMMAND_RESPONSE = "command_response"


# Frames decoded between two yields to the event loop: a batch's decoding must not hold the loop for
# long (the cost of one: docs/benchmarks.md, `bench/ingest.py`).
DECODE_SLICE = 100

Decode = Callable[[Connection, str, float], "tuple[FrameKind, Any] | None"]


@dataclass(slots=True)
class _Queued:
    conn: Connection
    kind: FrameKind
    payload: Any
    # When it was received (epoch seconds; kept for a TEXT frame, decoded later).
    at: float = 0.0


class IngestWriter:
    """The queue of frames (parsed, or a plain frame's text) and the task that stores them, in arrival
    order."""

    def __init__(self, decode: Decode, executor: ThreadPoolExecutor) -> None:
        # What a TEXT frame becomes (chat.gateway.frames.FrameReader.decode_text).
        self._decode = decode
        # A deque and an event rather than an asyncio.Queue: a burst puts thousands of frames a second and
        # the writer takes whatever is there at once, so the queue's per-item waiter bookkeeping was
        # pure cost.
        self._queue: deque[_Queued] = deque()
        self._queued = asyncio.Event()
        # One thread, one database connection, for the writer's batches and the gateway's connection
        # records (chat.gateway.connections runs those here too).
        self.executor = executor
        self._store = db(adapter_frames_store, executor=self.executor)
        self.stored_total = 0

    def enqueue(self, conn: Connection, kind: FrameKind, payload: Any) -> None:
        conn.backlog += 1
        self._queue.append(_Queued(conn, kind, payload, time.time() if kind is FrameKind.TEXT else 0.0))
        self._queued.set()

    def enqueue_message(self, conn: Connection, item: InboundItem) -> None:
        self.enqueue(conn, FrameKind.MESSAGE, item)

    async def run(self) -> None:
        while True:
            while not self._queue:
                self._queued.clear()
                await self._queued.wait()
            # Whatever piled up while the previous batch was being written goes in one transaction.
            queue = self._queue
            batch = [queue.popleft() for _ in range(min(len(queue), INGEST_BATCH))]
            frames = AdapterFrames()
            for i, q in enumerate(batch):
                if q.kind is FrameKind.TEXT:
                    if i and not i % DECODE_SLICE:
                        await asyncio.sleep(0)
                    try:
                        decoded = self._decode(q.conn, q.payload, q.at)
                    except Exception:
                        logger.exception("frame from %r dropped: decoding it failed", q.conn)
                        decoded = None
                    if decoded is None:
                        continue
                    q.kind, q.payload = decoded
                if q.kind is FrameKind.MESSAGE:
                    frames.messages.append(q.payload)
                elif q.kind is FrameKind.RECEIPT:
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
        by_uid = {id(q.payload): q for q in batch if q.kind is FrameKind.MESSAGE}
        for message in stored:
            origin = getattr(message, "inbound_item", None)
            q = by_uid.get(id(origin)) if origin is not None else None
            if q is not None and isinstance(q.conn, BrowserConnection):
                try:
                    await q.conn.send(browser_frame(message))
                except Exception:
                    logger.debug("browser went away before its message was confirmed", exc_info=True)
        for receiver, result in await inbound_stored.asend_robust(sender=Message, messages=stored):
            if isinstance(result, Exception):
                logger.error("inbound_stored listener %r failed: %s", receiver, result, exc_info=result)
