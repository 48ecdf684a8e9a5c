"""The embedded default's channel layer: Channels' in-memory layer with its expiry sweep amortised."""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer


class SweepingInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' InMemoryChannelLayer, except that its expiry sweep (expired messages, stale group
    memberships) runs at most once per `sweep_interval` seconds instead of on every `receive`.

    The parent walks every channel and every group on each receive: O(live channels) per message
    received. Every live session runtime holds a channel and a group, so with 10,000 of them each wake
    cost milliseconds of event-loop time and a burst of first messages grew quadratically
    (bench/sessions.py). Here a message or membership is dropped at most `sweep_interval` seconds after
    it expired (messages expire after 60 s, memberships after a day); nothing else changes."""

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
