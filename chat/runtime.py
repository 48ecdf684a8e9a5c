"""Session runtimes from the outside: what starts them, what wakes them, and this process's registry.

* Start: the gateway sends `chat.services.inbound_stored` after storing inbound messages; the receiver
  here hands them to the registry (chat.runtime_registry), which starts the session's runtime or
  wakes the live one. Whatever thread or loop the signal is sent from, the work runs on the
  registry's loop.
* Wake: `wake_session()` (async), `wake_session_soon()` (sync, any thread of the process whose loop
  runs the runtimes), `wake_session_from_sync_process()` (a process with no event loop, e.g. the task
  cluster). A wake is sent by this process's notifier (chat.notify): the channel-layer message
  `{"type": "session.wake", "reason": ...}` to the session's group, which reaches the runtime from
  every process on the scale-out layer, and only from within the ASGI process on the embedded default.
  A session without a live runtime ignores a wake: runtimes are started by inbound messages (and
  `registry.wake_or_start`).
* The runtime itself (the actor that awaits wake-ups and runs what the planner's decision says) is
  chat.session_runtime.
"""

from __future__ import annotations

import asyncio
import contextvars
import os

from asgiref.sync import SyncToAsync
from channels.layers import BaseChannelLayer

from chat.models import Direction, Message
from chat.notify import get_notifier
from chat.runtime_registry import RuntimeRegistry
from chat.services import inbound_stored
from chat.session_runtime import session_group
from core.aio import submit

__all__ = ["registry", "session_group", "wake_session", "wake_session_from_sync_process", "wake_session_soon"]


# --- waking a runtime, from anywhere -----------------------------------------------------------------


async def wake_session(session_pk: int, reason: str = "message", *, layer: BaseChannelLayer | None = None) -> bool:
    """Wake the live runtime of a session wherever it runs (the notifier's `wake_session`; `layer`: that
    channel layer instead of the configured one). The runtime then observes what was stored since its
    last cycle; a session with no live runtime ignores it. False if no layer is configured."""
    return await get_notifier().wake_session(session_pk, reason, layer=layer)


def wake_session_soon(session_pk: int, reason: str = "message") -> bool:
    """Sync: wake a session's runtime from any thread of the process whose event loop runs the
    runtimes (the loop itself, asgiref's worker threads, any thread once the registry is bound). The
    group_send is scheduled on that loop (`call_soon_threadsafe`); nothing waits for it, no async code
    is wrapped. False when this process has no such loop (use `wake_session_from_sync_process`)."""
    loop = registry.caller_loop()
    if loop is None:
        return False
    loop.call_soon_threadsafe(registry.send_wake, session_pk, reason, None, context=contextvars.Context())
    return True


def wake_session_from_sync_process(session_pk: int, reason: str = "message") -> bool:
    """Wake a session's runtime from a process that runs no event loop (the task cluster, a management
    command), through the notifier (it reaches the ASGI process only on the scale-out channel layer).
    Blocking: the wake runs on the process's background loop (core.aio) and this waits for it. Code
    in the ASGI process must not use it: it raises there (a running loop, or one of asgiref's worker
    threads); use `wake_session` or `wake_session_soon`."""
    if _has_event_loop():
        raise RuntimeError("this thread belongs to an event loop: use wake_session() or wake_session_soon()")
    return submit(wake_session(session_pk, reason)).result()


def _has_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        pass
    if getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) != os.getpid():
        return False
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    return loop is not None and not loop.is_closed()


# --- this process's runtimes ---------------------------------------------------------------------------

registry = RuntimeRegistry(wake=wake_session)


def on_inbound_stored(sender, messages: list[Message], **kwargs) -> None:
    """Receiver of `inbound_stored`: start or wake each session's runtime."""
    by_session: dict[int, list[int]] = {}
    for message in messages:
        if message.direction == Direction.IN:
            by_session.setdefault(message.session_id, []).append(message.pk)
    for session_pk, pks in by_session.items():
        registry.notify(session_pk, pks)


inbound_stored.connect(on_inbound_stored, dispatch_uid="chat.runtime.on_inbound_stored")
