"""Waking the dispatchers when a write makes scheduled work due sooner than they know.

The dispatcher sleeps until the next due instant it read, or its safety poll (`scheduling.poll_interval`,
30 s): every service that creates due work or moves it earlier (a new scheduled message or timer, a
reschedule, send now, retry, fire now, a timer's new spec) calls `dispatchers_wake_on_commit` inside its
transaction, so the dispatchers look again once the row is visible. A write that bypasses the services
(a raw UPDATE) wakes nobody: it is found by the safety poll.
"""

from __future__ import annotations

from django.db import transaction


def dispatchers_wake() -> None:
    """Wake every dispatcher now (this process's and the others'). Never raises."""
    from chat.notify import get_notifier  # the notifier's imports (channels) only where a wake is sent

    get_notifier().wake_dispatchers()


def dispatchers_wake_on_commit() -> None:
    """Wake every dispatcher once the current transaction commits (at once outside one)."""
    transaction.on_commit(dispatchers_wake)
