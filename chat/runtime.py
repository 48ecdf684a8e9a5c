"""Session runtimes: one asyncio task per active chat session in the ASGI process, and their registry.

The gateway sends `chat.services.inbound_stored` after storing inbound messages; the receiver here
wakes (or starts) the session's runtime on the registry's event loop with `call_soon_threadsafe`,
whatever thread or loop the signal is sent from. A runtime waits for news, lets a burst settle
(`chat.debounce_seconds`, at most 5× that for a never-ending stream), observes the inbound messages
stored since its last cycle (by primary key, so nothing is missed when signals coalesce), decides
whether this is worth a cycle (chat/planner.py has the rule) and runs it; then waits again.

The registry holds at most `chat.max_runtimes` runtimes: making room stops the least recently active
idle one (or, if all are busy, the least recently active). A runtime idle for
`chat.idle_evict_seconds` stops itself; the next message starts a fresh one, which first observes
the messages of that signal. Shutdown cancels every runtime and waits for it (a cycle cut short is
still recorded, marked cancelled): under daphne this is hooked to the reactor's "before shutdown"
trigger; elsewhere call `await registry.shutdown()`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from asgiref.sync import SyncToAsync, sync_to_async
from django.db import close_old_connections, connections

from chat import planner
from chat.models import ChatSession, Direction, Message
from chat.services import inbound_stored
from maibot.config import get_config

logger = logging.getLogger(__name__)


@dataclass
class _Observed:
    messages: list[Message]
    bot_message_ids: set[str]


def observe(*, session_pk: int, after_pk: int) -> _Observed:
    """Inbound messages of a session stored after `after_pk`, and which quoted ids are the bot's own."""
    messages = list(
        Message.objects.filter(session_id=session_pk, direction=Direction.IN, pk__gt=after_pk).order_by("pk")
    )
    quoted = {m.reply_to_platform_id for m in messages if m.reply_to_platform_id}
    own = set()
    if quoted:
        own = set(
            Message.objects.filter(
                session_id=session_pk, direction=Direction.OUT, platform_message_id__in=quoted
            ).values_list("platform_message_id", flat=True)
        )
    return _Observed(messages=messages, bot_message_ids=own)


_observe = sync_to_async(observe)


class SessionRuntime:
    """The loop of one session. All its state is touched only on the registry's event loop."""

    def __init__(self, registry: RuntimeRegistry, session_pk: int, last_seen_pk: int) -> None:
        self.registry = registry
        self.session_pk = session_pk
        self.session: ChatSession | None = None
        self.last_seen_pk = last_seen_pk
        self.loop = asyncio.get_running_loop()
        self.last_activity = self.loop.time()
        self.busy = False
        self.closed = False
        self.cycles = 0
        self.relook_at: float | None = None
        # Group-chat restraint (see chat/planner.py): unaddressed messages since the last cycle, and
        # consecutive unaddressed cycles that ended silent.
        self.backlog = 0
        self.silent_streak = 0
        self.history = planner.HistoryCache()
        self._news = False
        self._event = asyncio.Event()
        self.task: asyncio.Task | None = None

    def __repr__(self) -> str:
        return f"<SessionRuntime session={self.session_pk} busy={self.busy} closed={self.closed}>"

    def notify(self) -> None:
        self._news = True
        self.last_activity = self.loop.time()
        self._event.set()

    def stop(self) -> None:
        self.closed = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def run(self) -> None:
        try:
            self.session = await ChatSession.objects.aget(pk=self.session_pk)
            while True:
                reason = await self._wait()
                if reason is None:
                    logger.info("planner runtime for session %s idle; stopped", self.session_pk)
                    return
                if reason == "message":
                    await self._debounce()
                try:
                    await self._cycle(reason)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # The loop goes on: one broken cycle (a lost DB connection, a bug) must not
                    # silence the session; a short pause keeps a persistent fault from spinning.
                    logger.exception("planner runtime for session %s: cycle failed", self.session_pk)
                    await sync_to_async(close_old_connections)()  # a broken connection is replaced
                    await asyncio.sleep(1)
                finally:
                    self.busy = False
                    self.last_activity = self.loop.time()
        finally:
            self.closed = True
            self.registry._forget(self)

    async def _wait(self) -> str | None:
        """Until news ("message"), the one look after no_reply ("no_reply_timeout"), or idleness (None)."""
        idle_after = get_config().chat.idle_evict_seconds
        while True:
            if self._news:
                return "message"
            now = self.loop.time()
            if self.relook_at is not None and now >= self.relook_at:
                self.relook_at = None
                return "no_reply_timeout"
            idle_at = self.last_activity + idle_after
            if now >= idle_at:
                # No await between this check and the runtime closing: a notify cannot slip in.
                self.closed = True
                return None
            deadline = min(idle_at, self.relook_at) if self.relook_at is not None else idle_at
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout=max(0.0, deadline - now))
            except TimeoutError:
                pass

    async def _debounce(self) -> None:
        quiet = get_config().chat.debounce_seconds
        if quiet <= 0:
            return
        give_up = self.loop.time() + quiet * 5
        while True:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout=quiet)
            except TimeoutError:
                return
            if self.loop.time() >= give_up:
                return

    async def _observe(self) -> _Observed:
        self._news = False
        seen = await _observe(session_pk=self.session_pk, after_pk=self.last_seen_pk)
        if seen.messages:
            self.last_seen_pk = seen.messages[-1].pk
        return seen

    async def _observe_more(self) -> list[Message]:
        return (await self._observe()).messages

    async def _cycle(self, reason: str) -> None:
        from chat import offline

        cfg = get_config()
        started = self.loop.time()
        seen = await self._observe()
        observe_ms = (self.loop.time() - started) * 1000
        if reason == "message" and not seen.messages:
            return
        session = self.session
        mentioned = any(planner.mentions_bot(m, cfg, seen.bot_message_ids) for m in seen.messages)
        if cfg.offline:
            self.busy = True
            cycle = await offline.run_offline_cycle(session=session, new_messages=seen.messages, mentioned=mentioned)
            if cycle is not None:
                self.history.remember_cycle(cycle)
                self.cycles += 1
            return
        if not session.is_private:
            if mentioned:
                self.silent_streak = 0
            elif reason == "message":
                self.backlog += len(seen.messages)
                if self.backlog < planner.group_bar(cfg.chat.talk_frequency, self.silent_streak):
                    return
        self.busy = True
        trigger = reason if reason != "message" else f"{len(seen.messages)} new message(s)"
        result = await planner.run_cycle(
            session=session,
            new_messages=seen.messages,
            trigger=trigger,
            mentioned=mentioned,
            has_news=lambda: self._news,
            observe_more=self._observe_more,
            observe_ms=observe_ms,
            history_cache=self.history,
        )
        self.history.remember_cycle(result.cycle)
        self.cycles += 1
        self.backlog = 0
        if result.action in ("reply", "send_emoji"):
            self.silent_streak = 0
        elif result.action == "no_reply" and not mentioned and not session.is_private:
            self.silent_streak += 1
        # One look after a silent private turn; never a second one without a new message.
        if result.action == "no_reply" and session.is_private and reason == "message":
            self.relook_at = self.loop.time() + cfg.chat.no_reply_timeout
        else:
            self.relook_at = None


class RuntimeRegistry:
    """The live runtimes of this process, bound to one event loop (the ASGI server's)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.runtimes: dict[int, SessionRuntime] = {}
        self.stopping = False

    # --- waking, from any thread ------------------------------------------------------------------
    def notify(self, session_pk: int, message_pks: Iterable[int]) -> bool:
        """Wake (or start) the runtime of a session. Safe from any thread; False if no loop to run on."""
        loop = self._loop_for_caller()
        if loop is None:
            logger.warning("inbound messages for session %s but no event loop to run a planner on", session_pk)
            return False
        first = min((pk for pk in message_pks if pk is not None), default=None)
        # A fresh context: the sender's (e.g. asgiref's single-thread executor marker, or a consumer's
        # thread-sensitive context) must not leak into the runtime, or its ORM calls would deadlock.
        loop.call_soon_threadsafe(self._notify, session_pk, first, context=contextvars.Context())
        return True

    def _loop_for_caller(self) -> asyncio.AbstractEventLoop | None:
        if self.loop is not None and not self.loop.is_closed():
            return self.loop
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # A sync_to_async worker thread: asgiref remembers the loop that called it.
            loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
        if loop is None or loop.is_closed():
            return None
        self._bind(loop)
        return loop

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.runtimes = {}
        self.stopping = False
        reactor = sys.modules.get("twisted.internet.reactor")
        if reactor is not None and getattr(reactor, "_asyncioEventloop", None) is loop:
            from twisted.internet import defer

            # daphne: stop the runtimes before the reactor (and its asyncio loop) stops.
            def _stop():
                return defer.Deferred.fromFuture(asyncio.ensure_future(self.shutdown(), loop=loop))

            reactor.addSystemEventTrigger("before", "shutdown", _stop)

    # --- on the loop ----------------------------------------------------------------------------------
    def _notify(self, session_pk: int, first_pk: int | None) -> None:
        if self.stopping:
            return
        runtime = self.runtimes.get(session_pk)
        if runtime is None or runtime.closed:
            self._make_room()
            last_seen = (first_pk - 1) if first_pk is not None else 0
            runtime = SessionRuntime(self, session_pk, last_seen)
            self.runtimes[session_pk] = runtime
            runtime.task = asyncio.get_running_loop().create_task(
                runtime.run(), name=f"planner-session-{session_pk}", context=contextvars.Context()
            )
            runtime.task.add_done_callback(_log_crash)
        runtime.notify()

    def _make_room(self) -> None:
        cap = get_config().chat.max_runtimes
        while len(self.runtimes) >= cap:
            live = list(self.runtimes.values())
            idle = [r for r in live if not r.busy] or live
            victim = min(idle, key=lambda r: r.last_activity)
            logger.info("planner runtime cap (%d) reached: stopping session %s", cap, victim.session_pk)
            self.runtimes.pop(victim.session_pk, None)
            victim.stop()

    def _forget(self, runtime: SessionRuntime) -> None:
        if self.runtimes.get(runtime.session_pk) is runtime:
            del self.runtimes[runtime.session_pk]

    def get(self, session_pk: int) -> SessionRuntime | None:
        runtime = self.runtimes.get(session_pk)
        return runtime if runtime is not None and not runtime.closed else None

    async def shutdown(self, timeout: float = 10.0) -> int:
        """Stop every runtime and wait for them; the registry can be bound again afterwards."""
        self.stopping = True
        runtimes = list(self.runtimes.values())
        for runtime in runtimes:
            runtime.stop()
        tasks = [r.task for r in runtimes if r.task is not None]
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                logger.warning("%d planner runtimes did not stop within %.0fs", len(pending), timeout)
        # The runtimes' ORM work ran in asgiref's shared thread: release its connection too.
        await sync_to_async(connections.close_all)()
        logger.info("planner runtimes stopped (%d)", len(runtimes))
        self.runtimes = {}
        self.loop = None
        self.stopping = False
        return len(runtimes)


def _log_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("planner runtime %s crashed", task.get_name(), exc_info=task.exception())


registry = RuntimeRegistry()


def on_inbound_stored(sender, messages: list[Message], **kwargs) -> None:
    """Receiver of `inbound_stored`: wake each session's runtime."""
    by_session: dict[int, list[int]] = {}
    for message in messages:
        if message.direction == Direction.IN:
            by_session.setdefault(message.session_id, []).append(message.pk)
    for session_pk, pks in by_session.items():
        registry.notify(session_pk, pks)


inbound_stored.connect(on_inbound_stored, dispatch_uid="chat.runtime.on_inbound_stored")
