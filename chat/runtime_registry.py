"""The session runtimes of this process: which exist, the event loop they live on, starting, stopping
and shutting them down. What a runtime does once started is chat.session_runtime; the wake entry
points and the process's one registry are in chat.runtime.

Contracts:
* One loop: the registry binds to the event loop of the first caller that has one (the ASGI server's)
  and runs every runtime there; the methods marked "any thread" hand their work to that loop with
  `call_soon_threadsafe`, in a fresh context (the sender's must not leak into the runtime, or its ORM
  calls could deadlock in asgiref's thread-sensitive executor).
* At most one live runtime per session, and at most `chat.max_runtimes`: `runtimes` is ordered from
  least to most recently active, and making room stops the least recently active idle runtime (if all
  are busy, the least recently active).
* A runtime is handed its first wake directly (it cannot be reached through its group before it has
  joined it); later wakes go through the notifier (`wake`, given at construction: chat.notify),
  directly when the layer fails.
* Stopping is a `session.stop` on the runtime's own channel, then a cancellation if it has not ended
  `STOP_SECONDS` later (or the message cannot be sent). Shutdown stops every runtime and waits for
  them (a cycle cut short is still recorded, marked cancelled): under daphne it runs on the reactor's
  "before shutdown" trigger; elsewhere the owner awaits `shutdown()`. The registry can be bound again
  afterwards.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from channels.layers import BaseChannelLayer
from django.db import connections

from chat.planner.decision import NEWS
from chat.session_runtime import STOP, SessionRuntime
from core.config import get_config
from core.process import call_before_server_shutdown

logger = logging.getLogger(__name__)

# How long a runtime asked to stop has before it is cancelled (see RuntimeRegistry.stop).
STOP_SECONDS = 5.0

# Sends a wake to a session's group: True if it was sent (chat.runtime.wake_session, the notifier's).
GroupWake = Callable[[int, str], Awaitable[bool]]


class RuntimeRegistry:
    """The live runtimes of this process, bound to one event loop (the ASGI server's)."""

    def __init__(self, wake: GroupWake) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.runtimes: dict[int, SessionRuntime] = {}
        self.stopping = False
        self._wake = wake
        self._tasks: set[asyncio.Task] = set()  # consumers still running, evicted ones included
        self._sends: set[asyncio.Task] = set()  # wakes on their way through the channel layer
        self._stoppers: set[asyncio.Task] = set()  # stops on their way (see stop)
        self._stopping: set[asyncio.Task] = set()  # consumers asked to stop

    # --- from any thread ---------------------------------------------------------------------------------
    def notify(self, session_pk: int, message_pks: Iterable[int]) -> bool:
        """Start or wake the runtime of a session for new messages. Any thread; False if no loop to run on."""
        loop = self.caller_loop()
        if loop is None:
            logger.warning("inbound messages for session %s but no event loop to run a planner on", session_pk)
            return False
        if loop is not self.loop:
            self._bind(loop)
        first = min((pk for pk in message_pks if pk is not None), default=None)
        loop.call_soon_threadsafe(self._notify, session_pk, first, context=contextvars.Context())
        return True

    def wake_or_start(self, session_pk: int, reason: str, *, last_seen_pk: int) -> bool:
        """Wake a session's runtime for `reason` (not a new message: e.g. a plugin's proactive request),
        starting it first when it is not live; a started runtime takes messages up to `last_seen_pk` as
        seen. Any thread, but only once this process's runtimes have a loop (the ASGI server's, bound by
        its first inbound message): False otherwise, and nothing happens."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(self._wake_or_start, session_pk, reason, last_seen_pk, context=contextvars.Context())
        return True

    def caller_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop runtimes run on: the bound one, else the caller's (or, from a sync_to_async worker
        thread, the loop that called it); None when there is none."""
        if self.loop is not None and not self.loop.is_closed():
            return self.loop
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
        if loop is None or loop.is_closed():
            return None
        return loop

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.runtimes = {}
        self._tasks = set()
        self._sends = set()
        self.stopping = False
        # daphne: stop the runtimes before the reactor (and its asyncio loop) stops.
        call_before_server_shutdown(loop, self.shutdown)

    # --- on the loop --------------------------------------------------------------------------------------
    def _notify(self, session_pk: int, first_pk: int | None) -> None:
        if self.stopping:
            return
        runtime = self.runtimes.get(session_pk)
        if runtime is None or runtime.closed:
            self._start(session_pk, (first_pk - 1) if first_pk is not None else 0)
        else:
            self.send_wake(session_pk, NEWS, runtime)

    def _wake_or_start(self, session_pk: int, reason: str, last_seen_pk: int) -> None:
        if self.stopping:
            return
        runtime = self.runtimes.get(session_pk)
        if runtime is None or runtime.closed:
            runtime = self._start(session_pk, last_seen_pk)
        # Straight to the runtime: one just started has not joined its group yet.
        runtime.wake(reason)

    def _start(self, session_pk: int, last_seen_pk: int) -> SessionRuntime:
        self._make_room()
        runtime = SessionRuntime(self, session_pk)
        runtime.wake(NEWS)  # taken once it has joined its group
        self.runtimes[session_pk] = runtime
        scope = {"type": "chat.session", "session_pk": session_pk, "last_seen_pk": last_seen_pk}
        context = contextvars.Context()
        task = asyncio.get_running_loop().create_task(
            runtime(scope), name=f"planner-session-{session_pk}", context=context
        )
        runtime.task = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._reap, runtime), context=context)
        return runtime

    def send_wake(self, session_pk: int, reason: str, runtime: SessionRuntime | None) -> None:
        """On the loop: wake a session through the channel layer (`runtime`, when live here, directly
        if the layer fails)."""
        self.spawn(self._wake_through_layer(session_pk, reason, runtime))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A short errand on the loop (a wake on its way, a rejoin), cancelled by shutdown."""
        task = asyncio.ensure_future(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _wake_through_layer(self, session_pk: int, reason: str, runtime: SessionRuntime | None) -> None:
        try:
            sent = await self._wake(session_pk, reason)
        except Exception:
            logger.warning("channel layer unavailable: waking session %s directly", session_pk, exc_info=True)
            sent = False
        if not sent and runtime is not None and runtime.task is not None and not runtime.task.done():
            runtime.wake(reason)

    def touch(self, runtime: SessionRuntime) -> None:
        """Keep `runtimes` ordered from least to most recently active (O(1)): eviction takes the first."""
        if self.runtimes.get(runtime.session_pk) is runtime:
            self.runtimes[runtime.session_pk] = self.runtimes.pop(runtime.session_pk)

    def _make_room(self) -> None:
        cap = get_config().chat.max_runtimes
        while len(self.runtimes) >= cap:
            # The least recently active idle runtime (only busy ones are skipped), else the least
            # recently active of all: the order of `runtimes`, kept by touch.
            victim = next((r for r in self.runtimes.values() if not r.busy), None)
            if victim is None:
                victim = next(iter(self.runtimes.values()))
            logger.info("planner runtime cap (%d) reached: stopping session %s", cap, victim.session_pk)
            self.runtimes.pop(victim.session_pk, None)
            self.stop(victim)

    def stop(self, runtime: SessionRuntime) -> None:
        """Stop a runtime: a `session.stop` on its own channel ends its consumer. Not a cancellation
        first: on Redis one that arrives while the consumer waits in channels_redis' blocking pop was
        seen to be taken in only when the pop returned, or never (the task stayed "cancelling" in the
        receive). The consumer is cancelled only if the message cannot be sent, or it has not ended
        STOP_SECONDS later."""
        runtime.closed = True
        task = runtime.task
        if task is None or task.done() or task in self._stopping:
            return
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        layer, channel = runtime.channel_layer, runtime.channel_name
        if layer is None or not channel:
            task.cancel()
            return
        stopper = asyncio.ensure_future(self._ask_to_stop(layer, channel, task))
        self._stoppers.add(stopper)
        stopper.add_done_callback(self._stoppers.discard)

    async def _ask_to_stop(self, layer: BaseChannelLayer, channel: str, task: asyncio.Task) -> None:
        try:
            await layer.send(channel, {"type": STOP})
            await asyncio.wait([task], timeout=STOP_SECONDS)
        except Exception:
            logger.warning("could not ask planner runtime %s to stop; cancelling it", task.get_name())
        if not task.done():
            task.cancel()

    def finished(self, runtime: SessionRuntime) -> None:
        """The runtime's planner loop ended (idle, stopped or crashed): forget it and end the consumer."""
        if self.runtimes.get(runtime.session_pk) is runtime:
            del self.runtimes[runtime.session_pk]
        self.stop(runtime)

    def _reap(self, runtime: SessionRuntime, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self.runtimes.get(runtime.session_pk) is runtime:
            del self.runtimes[runtime.session_pk]
        if not task.cancelled() and task.exception() is not None:
            logger.error("planner runtime %s crashed", task.get_name(), exc_info=task.exception())

    def get(self, session_pk: int) -> SessionRuntime | None:
        runtime = self.runtimes.get(session_pk)
        return runtime if runtime is not None and not runtime.closed else None

    async def shutdown(self, timeout: float = 10.0) -> int:
        """Stop every runtime and wait for them; the registry can be bound again afterwards."""
        self.stopping = True
        runtimes = list(self.runtimes.values())
        for runtime in runtimes:
            self.stop(runtime)
        for send in list(self._sends):
            send.cancel()
        tasks = list(self._tasks)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                logger.warning("%d planner runtimes did not stop within %.0fs", len(pending), timeout)
                for task in pending:
                    task.cancel()
        # The runtimes' ORM work ran in asgiref's shared thread: release its connection too.
        await sync_to_async(connections.close_all)()
        logger.info("planner runtimes stopped (%d)", len(runtimes))
        self.runtimes = {}
        self._tasks = set()
        self._sends = set()
        self.loop = None
        self.stopping = False
        return len(runtimes)
