"""The gateway of one ASGI process, put together: its live connections and the outbox's Sink
(`connections`, chat.gateway.connections), what their frames become (`frames`, chat.gateway.frames),
the ingest writer and the outbox deliverer (tasks on the gateway's event loop), and its listener for
the other processes (chat.notify: outbox wake-ups, `close` for a connection replaced elsewhere).

One `Gateway` per event loop, started on the first ASGI call (daphne has no lifespan events: maibot.asgi
makes a `lifespan` call as soon as daphne runs).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from chat.gateway.connections import Connections
from chat.gateway.frames import FrameReader
from chat.gateway.writer import close_old_connection
from chat.notify import GatewayListener, get_notifier

logger = logging.getLogger(__name__)


class Gateway:
    """This process's gateway on one event loop: started once, closed by `aclose`."""

    def __init__(self) -> None:
        self.started = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        # One thread, one database connection, for the ingest writer's batches and the connection records.
        ingest = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest")
        self.connections = Connections(records=ingest)
        self.frames = FrameReader(self.connections)
        self.writer = self.frames.writer
        self.deliverer = self.connections.deliverer
        self.listener: GatewayListener | None = None

    def ensure_started(self) -> None:
        if self.started:
            return
        self.started = True
        self.loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.ensure_future(self.writer.run()))
        self._tasks.append(asyncio.ensure_future(self.deliverer.run()))
        self.listener = self.connections.listener = get_notifier().listen(self)
        how = self.listener.open()
        logger.info("gateway started (outbox %s)", how)

    def close_replaced(self, record_id: Any) -> None:
        """For the listener: a newer connection in another process replaced this record's."""
        self.connections.close_replaced(record_id)

    async def aclose(self) -> None:
        """Stop the tasks and release the database connections of the gateway's threads."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.listener is not None:
            await self.listener.close()
            self.listener = self.connections.listener = None
        for executor in (self.writer.executor, self.deliverer.executor):
            await asyncio.wrap_future(executor.submit(close_old_connection))
            executor.shutdown(wait=False)


_gateway: Gateway | None = None


def running_gateway() -> Gateway | None:
    """This process's gateway if one was started (by the ASGI server's first call), from any thread or
    loop; its `loop` is where its work runs (chat.gateway.plugin_adapters carries calls there)."""
    gateway = _gateway
    return gateway if gateway is not None and gateway.started else None


def get_gateway() -> Gateway:
    """This process's gateway, created and started in the running event loop on first use (a new
    loop, as each in-process test has, gets a new gateway: tasks cannot outlive their loop)."""
    global _gateway
    loop = asyncio.get_running_loop()
    if _gateway is None or _gateway.loop is not loop:
        _gateway = Gateway()
    _gateway.ensure_started()
    return _gateway
