"""Session runtimes: one Channels consumer per active chat session in the ASGI process, their registry,
and the API that wakes them from anywhere.

A runtime (`SessionRuntime`) is a `channels.consumer.AsyncConsumer` (its handlers are named for the
message types, as Channels dispatches them), called with a scope (`{"type": "chat.session",
"session_pk", "last_seen_pk"}`). It takes its own channel name from the channel layer, joins the group
`chat.session.<pk>` and then waits on its channel alone: its own dispatch loop, one await per message,
where Channels' `await_many_dispatch` keeps two receive tasks and an `asyncio.wait` alive per consumer
(the objects every full garbage collection walks, 10,000 runtimes over). A wake is the channel-layer message
`{"type": "session.wake", "reason": "message"}`, so any process can wake a live runtime with
`group_send`: `wake_session()` (async), `wake_session_soon()` (sync, any thread of the ASGI process),
`wake_session_from_sync_process()` (a process with no event loop, e.g. the cluster). With REDIS_URL
set the layer is Redis and the group reaches the runtime from every process; on the embedded default
(in-memory layer) only from within the ASGI process. A session without a live runtime ignores a wake:
runtimes are started by the registry, below.

The registry plays the ASGI server's part for runtimes: it starts each one, hands it its first wake
directly (`SessionRuntime.wake`: a wake cannot travel through the group before the runtime has joined
it; the runtime takes it once it has), and stops it by cancelling its task (the consumer's cleanup
then ends its planner work and leaves the group). The
gateway sends `chat.services.inbound_stored` after storing inbound messages; the receiver here hands
them to the registry's event loop with `call_soon_threadsafe` (whatever thread or loop the signal is
sent from), which starts the session's runtime or wakes the live one through the channel layer.

A runtime's planner work (a task beside Channels' dispatch loop, so wakes are still dispatched while a
cycle thinks) starts with news: it lets the burst settle (`chat.debounce_seconds`, at most 5× that for
a never-ending stream), observes the inbound messages stored since its last cycle (by primary key, so
nothing is missed when wakes coalesce), decides whether this is worth a cycle (the planner has the
rule) and runs it, again while news keeps coming; then it ends. An idle runtime holds no planner task
and no session row: its consumer waits on its channel and one timer (`loop.call_at`) waits for its next
timed event (the one look after a silent private turn, letting its history cache go after
`HISTORY_KEEP_SECONDS` of quiet, the hourly rejoin, idle eviction), so sleeping
runtimes cost no CPU and about 5 KB each (bench/sessions.py measures 10,000).

The registry holds at most `chat.max_runtimes` runtimes, ordered by recent activity: making room stops
the least recently active idle one (or, if all are busy, the least recently active). A runtime idle for
`chat.idle_evict_seconds` stops itself (the value in force when it went idle); the next message starts
a fresh one, which first observes the messages of that signal. Shutdown stops every runtime and waits
for it (a cycle cut short is still recorded, marked cancelled): under daphne this is hooked to the
reactor's "before shutdown" trigger (`maibot.process.call_before_server_shutdown`); elsewhere call
`await registry.shutdown()`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync, sync_to_async
from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import close_old_connections, connections

from chat import events, planner, talk
from chat.accounts import bot_account
from chat.agent import budget
from chat.models import ChatSession, Direction, Message
from chat.services import inbound_stored, message_hooks_apply
from maibot.config import get_config
from maibot.process import call_before_server_shutdown

logger = logging.getLogger(__name__)

WAKE = "session.wake"
START = "session.start"
STOP = "session.stop"
# How long a runtime asked to stop has before it is cancelled (see RuntimeRegistry._stop).
STOP_SECONDS = 5.0
# Group memberships expire (both layers default to a day): a long-lived runtime joins again hourly.
REJOIN_SECONDS = 3600.0
# A runtime quiet this long lets its history cache go (the next cycle reads the window again, one query):
# a lively chat keeps it, 10,000 quiet ones do not hold 10,000 windows of messages and cycle records.
HISTORY_KEEP_SECONDS = 300.0


def session_group(session_pk: int) -> str:
    """The channel-layer group a session's live runtime listens on."""
    return f"chat.session.{session_pk}"


def wake_message(reason: str = "message") -> dict[str, str]:
    return {"type": WAKE, "reason": reason}


# --- waking a runtime, from anywhere -----------------------------------------------------------------


async def wake_session(session_pk: int, reason: str = "message", *, layer: BaseChannelLayer | None = None) -> bool:
    """Wake the live runtime of a session wherever it runs: a group message on the channel layer (Redis:
    from every process; in-memory: within this process). The runtime then observes what was stored
    since its last cycle; a session with no live runtime ignores it. False if no layer is configured."""
    layer = layer if layer is not None else get_channel_layer()
    if layer is None:
        return False
    await layer.group_send(session_group(session_pk), wake_message(reason))
    return True


def wake_session_soon(session_pk: int, reason: str = "message") -> bool:
    """Sync: wake a session's runtime from any thread of the process whose event loop runs the
    runtimes (the loop itself, asgiref's worker threads, any thread once the registry is bound). The
    group_send is scheduled on that loop (`call_soon_threadsafe`); nothing waits for it, no async code
    is wrapped. False when this process has no such loop (use `wake_session_from_sync_process`)."""
    loop = registry._caller_loop()
    if loop is None:
        return False
    loop.call_soon_threadsafe(registry._send_wake, session_pk, reason, None, context=contextvars.Context())
    return True


def wake_session_from_sync_process(session_pk: int, reason: str = "message") -> bool:
    """Wake a session's runtime from a process that runs no event loop (the task cluster, a management
    command), through the channel layer (it reaches the ASGI process only with REDIS_URL set).

    This is the one place the runtime code wraps async code with `async_to_sync`, deliberately: a
    channel layer is async-only (every `BaseChannelLayer` method is a coroutine, and Channels documents
    `async_to_sync(channel_layer.group_send)` for sync callers), and such a process has no loop of its
    own to hand the call to, so it runs on a private one. Code in the ASGI process must not use it:
    it raises there (a running loop, or one of asgiref's worker threads); use `wake_session` or
    `wake_session_soon`."""
    if _has_event_loop():
        raise RuntimeError("this thread belongs to an event loop: use wake_session() or wake_session_soon()")
    return async_to_sync(wake_session, force_new_loop=True)(session_pk, reason)


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


# --- observing ---------------------------------------------------------------------------------------


@dataclass
class _Observed:
    messages: list[Message]
    bot_message_ids: set[str]
    bot_account: str = ""
    session: ChatSession | None = None


def observe(*, session_pk: int, after_pk: int, platform: str = "", load_session: bool = False) -> _Observed:
    """Inbound messages of a session stored after `after_pk`, which quoted ids are the bot's own, and the
    bot's account on the session's platform; with `load_session`, the session row too (in the same trip
    to the database thread: an idle runtime does not hold it). ChatSession.DoesNotExist if it is gone."""
    session = ChatSession.objects.get(pk=session_pk) if load_session else None
    if session is not None:
        platform = session.platform
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
    return _Observed(
        messages=messages,
        bot_message_ids=own,
        bot_account=bot_account(platform) if messages and platform else "",
        session=session,
    )


_observe = sync_to_async(observe)
_hooks_apply = sync_to_async(message_hooks_apply)
_blocked = sync_to_async(budget.blocked)


# --- the runtime consumer ----------------------------------------------------------------------------


def _settle(future: asyncio.Future, value: str) -> None:
    if not future.done():
        future.set_result(value)


class SessionRuntime(AsyncConsumer):
    """The runtime of one session: a consumer whose handlers only record news (`session.wake`), join
    its group (`session.start`), or stop it (`session.stop`). All its state is touched only on the
    registry's event loop.

    An idle runtime costs one waiting consumer (its channel receive) and one timer handle
    (`loop.call_at`) for its next timed event: the look after a silent private turn, the hourly group
    rejoin, idle eviction. Its planner task exists only while there is work: news starts it (debounce,
    cycle, again while news keeps coming), and it ends when the runtime is idle again."""

    handled = frozenset({START, WAKE, STOP})
    # Slots: 10,000 live runtimes each save an instance dict (Channels' attributes included: this
    # consumer sets only `scope`, `channel_layer` and `channel_name`).
    __slots__ = (
        "_news",
        "_quiet",
        "_requested",
        "_started",
        "backlog",
        "busy",
        "channel_layer",
        "channel_name",
        "closed",
        "cycles",
        "decided_pk",
        "history",
        "joined_at",
        "last_activity",
        "last_seen_pk",
        "loop",
        "planner_task",
        "registry",
        "relook_at",
        "scope",
        "session",
        "session_pk",
        "silent_streak",
        "task",
        "timer",
    )

    def __init__(self, registry: RuntimeRegistry, session_pk: int) -> None:
        self.registry = registry
        self.session_pk = session_pk
        self.session: ChatSession | None = None
        self.last_seen_pk = 0
        self.loop = asyncio.get_running_loop()
        self.last_activity = self.loop.time()
        self.busy = False
        self.closed = False
        self.cycles = 0
        self.relook_at: float | None = None
        # The newest inbound pk whose look has ended (a cycle run or skipped): what tests wait on to
        # know the runtime has decided about a message before asserting that nothing came of it.
        self.decided_pk = 0
        # Group-chat restraint (see the planner): unaddressed messages since the last cycle, and
        # consecutive unaddressed cycles that ended silent.
        self.backlog = 0
        self.silent_streak = 0
        # Made by the first model-planned cycle: offline answers and commands need no history.
        self.history: planner.HistoryCache | None = None
        self.channel_layer: BaseChannelLayer | None = None
        self.channel_name: str | None = None
        self.joined_at: float | None = None
        self.task: asyncio.Task | None = None  # the consumer itself (set by the registry)
        self.planner_task: asyncio.Task | None = None  # only while there is work
        self.timer: asyncio.TimerHandle | None = None  # the next timed event while idle
        self._started = False
        self._news = False
        # A wake for another reason than news (e.g. "proactive": a plugin asked for a turn): the next
        # cycle runs with it as its trigger even when nothing new was said.
        self._requested: str | None = None
        self._quiet: asyncio.Future | None = None  # the debounce's pause, ended early by news

    @property
    def group(self) -> str:
        return session_group(self.session_pk)

    def __repr__(self) -> str:
        return f"<SessionRuntime session={self.session_pk} busy={self.busy} closed={self.closed}>"

    async def __call__(self, scope, receive=None, send=None) -> None:
        """Join the group, take the registry's first wake, then dispatch what comes on the channel until
        `session.stop` or cancellation (the registry's stop). `receive` and `send` are unused: nothing
        but the channel speaks to a runtime, and it speaks through the send service."""
        if scope.get("type") != "chat.session" or scope.get("session_pk") != self.session_pk:
            raise ValueError(f"a session runtime needs a chat.session scope for session {self.session_pk}")
        self.scope = scope
        self.last_seen_pk = scope.get("last_seen_pk", 0)
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        try:
            if self.channel_layer is not None:
                self.channel_name = await self.channel_layer.new_channel()
            await self.session_start({"type": START})
            if self._news or self._requested is not None:
                self.notify()  # the wake the registry handed over before the runtime had joined
            if self.channel_layer is None:
                await self.loop.create_future()  # nothing can reach it: it waits for its stop
            while True:
                await self.dispatch(await self.channel_layer.receive(self.channel_name))
        except StopConsumer:
            pass
        except asyncio.CancelledError:
            if not self.closed:
                raise  # cancelled from outside: it ends cancelled
            # The registry's stop (it closes the runtime, then cancels its wait): a clean end.
            asyncio.current_task().uncancel()
        finally:
            # However the consumer ends (session.stop, cancelled, or its channel receive failing, e.g.
            # Redis gone), its planner work ends with it: never a loop the registry no longer knows.
            self.closed = True
            self._disarm()
            if self.planner_task is not None and not self.planner_task.done():
                self.planner_task.cancel()
                # asyncio.wait, not await: the loop's cancellation must not cut this cleanup short.
                await asyncio.wait([self.planner_task])
            if self.joined_at is not None and self.channel_layer is not None:
                try:
                    await self.channel_layer.group_discard(self.group, self.channel_name)
                except Exception:
                    logger.warning("planner runtime for session %s could not leave its group", self.session_pk)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Like AsyncConsumer.dispatch, minus its `close_old_connections` before each handler: these
        handlers touch no database, and it would close, between two queries of a running cycle, the
        connection the planner loop uses in asgiref's shared thread. A message of another type (any
        process can send to the group) is logged and dropped rather than killing the runtime."""
        kind = message.get("type") if isinstance(message, dict) else None
        if not isinstance(kind, str) or kind not in self.handled:
            logger.warning("planner runtime for session %s: ignored message %r", self.session_pk, kind)
            return
        await getattr(self, kind.replace(".", "_"))(message)

    # --- handlers ------------------------------------------------------------------------------------
    async def session_start(self, message: dict[str, Any]) -> None:
        if self._started:
            return
        self._started = True
        await self._join()
        self._arm()

    async def session_wake(self, message: dict[str, Any]) -> None:
        self.wake(str(message.get("reason") or "message"))

    def wake(self, reason: str = "message") -> None:
        """A wake, as `session.wake` brings it; the registry calls it directly for a runtime's first wake
        and when the channel layer failed. Before the runtime has started it is kept for its start."""
        if self.closed:
            return
        if reason != "message":
            self._requested = reason
        if self._started:
            self.notify()
        elif reason == "message":
            self._news = True

    async def session_stop(self, message: dict[str, Any]) -> None:
        self.closed = True
        raise StopConsumer  # __call__ then stops the planner work and leaves the group

    async def _join(self) -> None:
        if self.channel_layer is None:
            return
        try:
            await self.channel_layer.group_add(self.group, self.channel_name)
            self.joined_at = self.loop.time()
        except Exception:
            # The runtime still runs; wakes come through the registry's fallback (see _send_wake).
            logger.exception("planner runtime for session %s could not join its group", self.session_pk)

    # --- news, timers and the planner work ---------------------------------------------------------------
    def notify(self) -> None:
        self._news = True
        self.last_activity = self.loop.time()
        self.registry._touch(self)
        if self.closed:
            return
        if self.planner_task is None:
            self._work_on("message")
        elif self._quiet is not None:
            _settle(self._quiet, "news")

    def _work_on(self, reason: str) -> None:
        self._disarm()
        self.planner_task = self.loop.create_task(
            self.run(reason), name=f"planner-work-{self.session_pk}", context=contextvars.Context()
        )

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _arm(self) -> None:
        """One timer for the next timed event of an idle runtime (no task, no polling)."""
        self._disarm()
        if self.closed or self.planner_task is not None:
            return
        at = self.last_activity + get_config().chat.idle_evict_seconds
        if self.relook_at is not None:
            at = min(at, self.relook_at)
        if self.joined_at is not None:
            at = min(at, self.joined_at + REJOIN_SECONDS)
        if self.history is not None:
            at = min(at, self.last_activity + HISTORY_KEEP_SECONDS)
        self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.closed or self.planner_task is not None:
            return
        now = self.loop.time()
        if self.relook_at is not None and now >= self.relook_at:
            self.relook_at = None
            self._work_on("no_reply_timeout")
            return
        if now >= self.last_activity + get_config().chat.idle_evict_seconds:
            # Synchronous from the check to closing: a wake cannot slip in between.
            logger.info("planner runtime for session %s idle; stopped", self.session_pk)
            self.closed = True
            self.registry._finished(self)
            return
        if self.joined_at is not None and now >= self.joined_at + REJOIN_SECONDS:
            # Group memberships expire: join again (a failed join is tried again an hour later).
            self.joined_at = now
            self.registry._spawn(self._join())
        if self.history is not None and now >= self.last_activity + HISTORY_KEEP_SECONDS:
            self.history = None
        self._arm()

    async def run(self, reason: str) -> None:
        """The planner work of one stretch of news: let the burst settle, run the cycle, and again while
        news keeps coming; then the runtime is idle (its timer armed) until the next wake."""
        try:
            while True:
                if self._requested is not None:
                    reason, self._requested = self._requested, None
                if reason == "message":
                    await self._debounce()
                try:
                    await self._cycle(reason)
                except (asyncio.CancelledError, ChatSession.DoesNotExist):
                    raise  # a deleted session ends its runtime (below)
                except Exception:
                    # The loop goes on: one broken cycle (a lost DB connection, a bug) must not
                    # silence the session; a short pause keeps a persistent fault from spinning.
                    logger.exception("planner runtime for session %s: cycle failed", self.session_pk)
                    await sync_to_async(close_old_connections)()  # a broken connection is replaced
                    await asyncio.sleep(1)
                finally:
                    self.busy = False
                    self.last_activity = self.loop.time()
                    self.registry._touch(self)
                    self.decided_pk = self.last_seen_pk
                if self.closed or (not self._news and self._requested is None):
                    # Idle again: the session row is read afresh by the next stretch of work (one query),
                    # not held by 10,000 sleeping runtimes.
                    self.session = None
                    return
                reason = "message"
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("planner runtime for session %s crashed", self.session_pk)
            self.closed = True
            self.registry._finished(self)
        finally:
            if self.planner_task is asyncio.current_task():
                self.planner_task = None
                self._arm()

    async def _debounce(self) -> None:
        quiet = get_config().chat.debounce_seconds
        if quiet <= 0:
            return
        give_up = self.loop.time() + quiet * 5
        while True:
            pause = self._quiet = self.loop.create_future()
            timer = self.loop.call_later(quiet, _settle, pause, "quiet")
            try:
                outcome = await pause
            finally:
                timer.cancel()
                self._quiet = None
            if outcome == "quiet" or self.loop.time() >= give_up:
                return

    async def _observe(self) -> _Observed:
        self._news = False
        seen = await _observe(
            session_pk=self.session_pk,
            after_pk=self.last_seen_pk,
            platform=self.session.platform if self.session else "",
            load_session=self.session is None,
        )
        if seen.session is not None:
            self.session = seen.session
        if seen.messages:
            self.last_seen_pk = seen.messages[-1].pk
        return seen

    async def _observe_more(self) -> list[Message]:
        return await self._receive_points(talk.plannable((await self._observe()).messages, self.session)[0])

    async def _receive_points(self, messages: list[Message]) -> list[Message]:
        """The receive hook points (chat.events) for each new message: a handler may rewrite its text
        (stored) or stop it (stored, never planned). Free when nobody listens."""
        points = (events.Point.RECEIVE_BEFORE_PROCESS, events.Point.RECEIVE_AFTER_PROCESS)
        if not messages or not any(events.has_handlers(p) for p in points):
            return messages
        kept = []
        for message in messages:
            text, aborted_by = message.text, ""
            for point in points:
                emission = await events.aemit(point, message=message, session=self.session, text=text)
                if isinstance(emission.kwargs.get("text"), str):
                    text = emission.kwargs["text"]
                if emission.aborted:
                    aborted_by = emission.aborted_by
                    break
            if text != message.text or aborted_by:
                await _hooks_apply(message=message, text=text, aborted_by=aborted_by)
            if aborted_by:
                logger.info("message %s stopped by %s", message.pk, aborted_by)
            else:
                kept.append(message)
        return kept

    async def _cycle(self, reason: str) -> None:
        from chat import commands as chat_commands
        from chat import offline

        cfg = get_config()
        started = self.loop.time()
        seen = await self._observe()
        observe_ms = (self.loop.time() - started) * 1000
        if reason == "message" and not seen.messages:
            return
        session = self.session
        # Ignored chats and people, and commands of those who may not use them: stored, never planned.
        new_messages, _ = talk.plannable(seen.messages, session, cfg)
        new_messages = await self._receive_points(new_messages)
        if reason == "message" and not new_messages:
            return
        mentioned = any(planner.mentions_bot(m, cfg, seen.bot_message_ids, seen.bot_account) for m in new_messages)
        over_budget = ""
        if not cfg.offline and cfg.llm.budgets:
            over_budget = await _blocked(task="planner", session_id=session.pk, cfg=cfg)
        if cfg.offline or over_budget:
            # No model, or its daily budget is spent: the offline planner answers (no model call).
            self.busy = True
            cycle = await offline.run_offline_cycle(
                session=session, new_messages=new_messages, mentioned=mentioned, over_budget=over_budget
            )
            if cycle is not None:
                if self.history is not None:
                    self.history.remember_cycle(cycle)
                self.cycles += 1
            return
        if chat_commands.planner_commands():
            # Plugins' commands read the messages first; what they handle never reaches the model.
            self.busy = True
            handled, command_cycle = await chat_commands.run_commands(session=session, new_messages=new_messages)
            if command_cycle is not None:
                if self.history is not None:
                    self.history.remember_cycle(command_cycle)
                self.cycles += 1
            if handled:
                new_messages = [m for m in new_messages if m.pk not in handled]
                if not new_messages and reason == "message":
                    return
                mentioned = any(
                    planner.mentions_bot(m, cfg, seen.bot_message_ids, seen.bot_account) for m in new_messages
                )
        if not session.is_private:
            if mentioned:
                self.silent_streak = 0
            elif reason == "message":
                self.backlog += len(new_messages)
                if self.backlog < planner.group_bar(talk.talk_frequency(session, cfg=cfg), self.silent_streak):
                    return
        self.busy = True
        if self.history is None:
            self.history = planner.HistoryCache()
        trigger = reason if reason != "message" else f"{len(new_messages)} new message(s)"
        result = await planner.run_cycle(
            session=session,
            new_messages=new_messages,
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


# --- the registry -------------------------------------------------------------------------------------


class RuntimeRegistry:
    """The live runtimes of this process, bound to one event loop (the ASGI server's)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.runtimes: dict[int, SessionRuntime] = {}
        self.stopping = False
        self._tasks: set[asyncio.Task] = set()  # consumers still running, evicted ones included
        self._sends: set[asyncio.Task] = set()  # wakes on their way through the channel layer
        self._stoppers: set[asyncio.Task] = set()  # stops on their way (see _stop)
        self._stopping: set[asyncio.Task] = set()  # consumers asked to stop

    # --- from any thread ---------------------------------------------------------------------------------
    def notify(self, session_pk: int, message_pks: Iterable[int]) -> bool:
        """Start or wake the runtime of a session. Safe from any thread; False if no loop to run on."""
        loop = self._caller_loop()
        if loop is None:
            logger.warning("inbound messages for session %s but no event loop to run a planner on", session_pk)
            return False
        if loop is not self.loop:
            self._bind(loop)
        first = min((pk for pk in message_pks if pk is not None), default=None)
        # A fresh context: the sender's (e.g. asgiref's single-thread executor marker, or a consumer's
        # thread-sensitive context) must not leak into the runtime, or its ORM calls would deadlock.
        loop.call_soon_threadsafe(self._notify, session_pk, first, context=contextvars.Context())
        return True

    def wake_or_start(self, session_pk: int, reason: str, *, last_seen_pk: int) -> bool:
        """Wake a session's runtime for `reason` (not a new message: e.g. a plugin's proactive request),
        starting it first when it is not live; a started runtime takes messages up to `last_seen_pk` as
        seen. Safe from any thread, but only once this process's runtimes have a loop (the ASGI server's,
        bound by its first inbound message): False otherwise, and nothing happens."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return False
        loop.call_soon_threadsafe(self._wake_or_start, session_pk, reason, last_seen_pk, context=contextvars.Context())
        return True

    def _wake_or_start(self, session_pk: int, reason: str, last_seen_pk: int) -> None:
        if self.stopping:
            return
        runtime = self.runtimes.get(session_pk)
        if runtime is None or runtime.closed:
            runtime = self._start(session_pk, last_seen_pk)
        # Straight to the runtime: one just started has not joined its group yet.
        runtime.wake(reason)

    def _caller_loop(self) -> asyncio.AbstractEventLoop | None:
        if self.loop is not None and not self.loop.is_closed():
            return self.loop
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # A sync_to_async worker thread: asgiref remembers the loop that called it.
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
            self._send_wake(session_pk, "message", runtime)

    def _start(self, session_pk: int, last_seen_pk: int) -> SessionRuntime:
        self._make_room()
        runtime = SessionRuntime(self, session_pk)
        runtime.wake("message")  # taken once it has joined its group
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

    def _send_wake(self, session_pk: int, reason: str, runtime: SessionRuntime | None) -> None:
        self._spawn(self._wake_through_layer(session_pk, reason, runtime))

    def _spawn(self, coro) -> None:
        """A short errand on the loop (a wake on its way, a rejoin), cancelled by shutdown."""
        task = asyncio.ensure_future(coro)
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    async def _wake_through_layer(self, session_pk: int, reason: str, runtime: SessionRuntime | None) -> None:
        try:
            sent = await wake_session(session_pk, reason)
        except Exception:
            logger.warning("channel layer unavailable: waking session %s directly", session_pk, exc_info=True)
            sent = False
        if not sent and runtime is not None and runtime.task is not None and not runtime.task.done():
            runtime.wake(reason)

    def _touch(self, runtime: SessionRuntime) -> None:
        """Keep `runtimes` ordered from least to most recently active (O(1)): eviction takes the first."""
        if self.runtimes.get(runtime.session_pk) is runtime:
            self.runtimes[runtime.session_pk] = self.runtimes.pop(runtime.session_pk)

    def _make_room(self) -> None:
        cap = get_config().chat.max_runtimes
        while len(self.runtimes) >= cap:
            # The least recently active idle runtime (only busy ones are skipped), else the least
            # recently active of all: the order of `runtimes`, kept by _touch.
            victim = next((r for r in self.runtimes.values() if not r.busy), None)
            if victim is None:
                victim = next(iter(self.runtimes.values()))
            logger.info("planner runtime cap (%d) reached: stopping session %s", cap, victim.session_pk)
            self.runtimes.pop(victim.session_pk, None)
            self._stop(victim)

    def _stop(self, runtime: SessionRuntime) -> None:
        """Stop a runtime: a `session.stop` on its own channel ends its consumer (its cleanup, see
        SessionRuntime.__call__, ends the planner work, a cycle cut short recorded as cancelled, and
        leaves the group). Not a cancellation first: on Redis one that arrives while the consumer waits
        in channels_redis' blocking pop was seen to be taken in only when the pop returned, or never
        (the task stayed "cancelling" in the receive). The consumer is cancelled only if the message
        cannot be sent, or it has not ended STOP_SECONDS later."""
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

        async def ask() -> None:
            try:
                await layer.send(channel, {"type": STOP})
                await asyncio.wait([task], timeout=STOP_SECONDS)
            except Exception:
                logger.warning("could not ask planner runtime %s to stop; cancelling it", task.get_name())
            if not task.done():
                task.cancel()

        stopper = asyncio.ensure_future(ask())
        self._stoppers.add(stopper)
        stopper.add_done_callback(self._stoppers.discard)

    def _finished(self, runtime: SessionRuntime) -> None:
        """The runtime's planner loop ended (idle, stopped or crashed): forget it and end the consumer."""
        if self.runtimes.get(runtime.session_pk) is runtime:
            del self.runtimes[runtime.session_pk]
        self._stop(runtime)

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
            self._stop(runtime)
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


registry = RuntimeRegistry()


def on_inbound_stored(sender, messages: list[Message], **kwargs) -> None:
    """Receiver of `inbound_stored`: start or wake each session's runtime."""
    by_session: dict[int, list[int]] = {}
    for message in messages:
        if message.direction == Direction.IN:
            by_session.setdefault(message.session_id, []).append(message.pk)
    for session_pk, pks in by_session.items():
        registry.notify(session_pk, pks)


inbound_stored.connect(on_inbound_stored, dispatch_uid="chat.runtime.on_inbound_stored")
