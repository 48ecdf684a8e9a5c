"""The embedded default's channel layer: Channels' in-memory layer, lighter per channel and with its
expiry sweep amortised, for 10,000 live session runtimes in one process (each holds a channel)."""

from __future__ import annotations

import asyncio
import time
from copy import deepcopy
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer


class ChannelQueue:
    """One channel's messages: the part of asyncio.Queue the in-memory layer uses (`put_nowait`, `get`,
    `get_nowait`, `empty`, `_queue`), kept in two small lists, because an asyncio.Queue allocates four
    deques whether or not anything is ever queued (sizes: docs/benchmarks.md)."""

    __slots__ = ("_getters", "_queue", "maxsize")

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._queue: list[Any] = []  # (expires_at, message), oldest first
        self._getters: list[asyncio.Future] = []

    def empty(self) -> bool:
        return not self._queue

    def qsize(self) -> int:
        return len(self._queue)

    def put_nowait(self, item: Any) -> None:
        if 0 < self.maxsize <= len(self._queue):
            raise asyncio.QueueFull
        self._queue.append(item)
        self._wake_next()

    def get_nowait(self) -> Any:
        if not self._queue:
            raise asyncio.QueueEmpty
        return self._queue.pop(0)

    async def get(self) -> Any:
        while not self._queue:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                if getter in self._getters:
                    self._getters.remove(getter)
                if self._queue and not getter.cancelled():
                    self._wake_next()  # woken, then cancelled: the next receiver gets the message
                raise
        return self.get_nowait()

    def _wake_next(self) -> None:
        while self._getters:
            getter = self._getters.pop(0)
            if not getter.done():
                getter.set_result(None)
                return


class SweepingInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' InMemoryChannelLayer (channels 4.3) with two changes, nothing else:

    - its expiry sweep (expired messages, stale group memberships) runs at most once per
      `sweep_interval` seconds instead of on every `receive` (the parent walks every channel and every
      group on each receive: O(live channels) per message). A message or membership is dropped at most
      `sweep_interval` seconds after it expired (messages expire after 60 s, memberships after a day);
    - a channel's queue is a ChannelQueue, created when first needed (the parent builds an
      asyncio.Queue on every send and receive, used or not).

    `send` and `receive` follow the parent's code otherwise (type and name checks, capacity →
    ChannelFull, the deep copy, an empty channel forgotten after a receive)."""

    def __init__(self, sweep_interval: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sweep_interval = sweep_interval
        self._swept_at = float("-inf")

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at < self.sweep_interval:
            return
        self._swept_at = now
        super()._clean_expired()

    def _queue(self, channel: str) -> ChannelQueue:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = ChannelQueue(self.get_capacity(channel))
        return queue

    async def send(self, channel: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        try:
            self._queue(channel).put_nowait((time.time() + self.expiry, deepcopy(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def receive(self, channel: str) -> dict:
        self.require_valid_channel_name(channel)
        self._clean_expired()
        queue = self._queue(channel)
        try:
            _, message = await queue.get()
        finally:
            if queue.empty() and self.channels.get(channel) is queue:
                self.channels.pop(channel, None)
        return message
