"""The runtime of one chat session: an actor that waits for wake-ups and does what the planner's
decision says (chat.planner.decision). The registry (chat.runtimes) starts and stops it; the
wake entry points (chat.runtime) reach it.

It is a `channels.consumer.AsyncConsumer` called with the scope `{"type": "chat.session",
"session_pk", "last_seen_pk"}`. It takes a channel of its own, joins the group `session_group(pk)`
and dispatches what arrives on its channel, one await per message (its own loop rather than Channels'
`await_many_dispatch`, which keeps two receive tasks and an `asyncio.wait` alive per consumer: objects
every full garbage collection walks, for every live runtime):

* `session.start`: join the group, then take the wake the registry handed over before it had joined;
* `session.wake` `{"reason"}`: news ("message": new inbound messages are stored) or a request for a
  turn (any other reason, e.g. a plugin's "proactive"), which is the next look's trigger even when
  nothing new was said;
* `session.stop`: end. However the consumer ends (stop, cancellation, its channel failing), its
  planner work ends with it (a cycle cut short is recorded as cancelled) and it leaves the group.

Invariants:
* Its state is touched only on the registry's event loop.
* At most one planner task, and only while there is work: news starts it; it lets the burst settle
  (chat.planner.decision.debounce), looks (observe the inbound messages stored since its last look,
  by primary key; decide; act) and looks again while news keeps coming; then it ends.
* An idle runtime holds no planner task and no session row: its consumer awaits its channel and one
  timer (`loop.call_at`) waits for its next timed event: the look after a silent private turn, letting
  its history cache go after `HISTORY_KEEP_SECONDS` of quiet, the hourly group rejoin, and idle
  eviction (`chat.idle_evict_seconds` after its last activity).
* `decided_pk` is the newest inbound primary key whose look has ended (a cycle run or skipped).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, Protocol

from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import close_old_connections

from chat import planner, talk
from chat.agent import budget
from chat.commands import planner_commands, run_commands
from chat.models import ChatSession, Message, PlannerCycle
from chat.offline import run_offline_cycle
from chat.planner.decision import (
    NEWS,
    NO_REPLY_TIMEOUT,
    Decision,
    Observed,
    Step,
    TalkState,
    after_cycle,
    debounce,
    decide,
)
from chat.planner.observe import Observation, aobserve, receive_points
from core.aio import db
from core.config import BotConfig, get_config

logger = logging.getLogger(__name__)

WAKE = "session.wake"
START = "session.start"
STOP = "session.stop"
# Group memberships expire (both layers default to a day): a long-lived runtime joins again hourly.
REJOIN_SECONDS = 3600.0
# A runtime quiet this long lets its history cache go (the next cycle reads the window again, one query):
# a lively chat keeps it, many quiet ones do not each hold a window of messages and cycle records.
HISTORY_KEEP_SECONDS = 300.0

_blocked = db(budget.blocked)
_UNRESTRAINED = TalkState()  # frozen: one instance serves every fresh runtime


def session_group(session_pk: int) -> str:
    """The channel-layer group a session's live runtime listens on."""
    return f"chat.session.{session_pk}"


class RuntimeOwner(Protocol):
    """What a runtime needs from the registry that started it (chat.runtimes.SessionRuntimes)."""

    def touch(self, runtime: SessionRuntime) -> None:
        """The runtime was active just now (the registry keeps its order of recent activity)."""

    def finished(self, runtime: SessionRuntime) -> None:
        """The runtime's work ended for good (idle, or crashed): forget it and end its consumer."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a short errand on the loop (cancelled by shutdown)."""


def _settle(future: asyncio.Future, value: str) -> None:
    if not future.done():
        future.set_result(value)


class SessionRuntime(AsyncConsumer):
    """The runtime of one session (see the module docstring)."""

    handled = frozenset({START, WAKE, STOP})
    # Slots: every live runtime saves an instance dict (Channels' attributes included: this consumer
    # sets only `scope`, `channel_layer` and `channel_name`).
    __slots__ = (
        "_news",
        "_quiet",
        "_requested",
        "_started",
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
        "talk_state",
        "task",
        "timer",
    )

    def __init__(self, registry: RuntimeOwner, session_pk: int) -> None:
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
        # What tests wait on to know the runtime has decided about a message before asserting that
        # nothing came of it.
        self.decided_pk = 0
        self.talk_state = _UNRESTRAINED
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
        self._requested: str | None = None  # a wake for another reason than news, for the next look
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
            await self._end()

    async def _end(self) -> None:
        """The consumer's cleanup: never a planner loop the registry no longer knows, never a group
        membership left behind."""
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
        self.wake(str(message.get("reason") or NEWS))

    def wake(self, reason: str = NEWS) -> None:
        """A wake, as `session.wake` brings it; the registry calls it directly for a runtime's first wake
        and when the channel layer failed. Before the runtime has started it is kept for its start."""
        if self.closed:
            return
        if reason != NEWS:
            self._requested = reason
        if self._started:
            self.notify()
        elif reason == NEWS:
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
            # The runtime still runs; wakes come through the registry's fallback (a direct wake).
            logger.exception("planner runtime for session %s could not join its group", self.session_pk)

    # --- news, timers and the planner work ---------------------------------------------------------------
    def notify(self) -> None:
        self._news = True
        self.last_activity = self.loop.time()
        self.registry.touch(self)
        if self.closed:
            return
        if self.planner_task is None:
            self._work_on(NEWS)
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
            self._work_on(NO_REPLY_TIMEOUT)
            return
        if now >= self.last_activity + get_config().chat.idle_evict_seconds:
            # Synchronous from the check to closing: a wake cannot slip in between.
            logger.info("planner runtime for session %s idle; stopped", self.session_pk)
            self.closed = True
            self.registry.finished(self)
            return
        if self.joined_at is not None and now >= self.joined_at + REJOIN_SECONDS:
            # Group memberships expire: join again (a failed join is tried again an hour later).
            self.joined_at = now
            self.registry.spawn(self._join())
        if self.history is not None and now >= self.last_activity + HISTORY_KEEP_SECONDS:
            self.history = None
        self._arm()

    async def run(self, reason: str) -> None:
        """The planner work of one stretch of news: let the burst settle, look, and again while news
        keeps coming; then the runtime is idle (its timer armed) until the next wake."""
        try:
            while True:
                if self._requested is not None:
                    reason, self._requested = self._requested, None
                if reason == NEWS:
                    await self._debounce()
                await self._look_guarded(reason)
                if self.closed or (not self._news and self._requested is None):
                    # Idle again: the session row is read afresh by the next stretch of work (one query).
                    self.session = None
                    return
                reason = NEWS
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("planner runtime for session %s crashed", self.session_pk)
            self.closed = True
            self.registry.finished(self)
        finally:
            if self.planner_task is asyncio.current_task():
                self.planner_task = None
                self._arm()

    async def _look_guarded(self, reason: str) -> None:
        """One look; a broken one is logged and the work goes on (a deleted session ends it)."""
        try:
            await self.look(reason)
        except (asyncio.CancelledError, ChatSession.DoesNotExist):
            raise
        except Exception:
            # One broken look (a lost DB connection, a bug) must not silence the session; a short
            # pause keeps a persistent fault from spinning.
            logger.exception("planner runtime for session %s: cycle failed", self.session_pk)
            await db(close_old_connections)()  # a broken connection is replaced
            await asyncio.sleep(1)
        finally:
            self.busy = False
            self.last_activity = self.loop.time()
            self.registry.touch(self)
            self.decided_pk = self.last_seen_pk

    async def _debounce(self) -> None:
        window = debounce(get_config())
        if window is None:
            return
        quiet, longest = window
        give_up = self.loop.time() + longest
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

    # --- one look: observe, decide, act --------------------------------------------------------------
    async def look(self, reason: str) -> None:
        """Observe the news, decide (chat.planner.decision) and do what the decision says."""
        cfg = get_config()
        started = self.loop.time()
        seen = await self._observe()
        observe_ms = (self.loop.time() - started) * 1000
        observed = Observed(
            reason=reason,
            messages=tuple(await self._plannable(seen.messages, cfg)),
            now=talk.clock(),
            bot_message_ids=frozenset(seen.bot_message_ids),
            bot_account=seen.bot_account,
            has_planner_commands=bool(planner_commands()),
        )
        decision = await self._decide(observed, cfg)
        self.talk_state = decision.state
        if decision.step is Step.OFFLINE:
            await self._answer_offline(decision)
        elif decision.step is Step.CYCLE:
            await self._plan(decision, reason=reason, observe_ms=observe_ms, cfg=cfg)

    async def _decide(self, observed: Observed, cfg: BotConfig) -> Decision:
        """Ask `decide` and answer its questions (the budget, the commands' look) until it is final."""
        while True:
            decision = decide(observed, self.session, self.talk_state, cfg)
            if decision.step is Step.ASK_BUDGET:
                over_budget = await _blocked(task="planner", session_id=self.session.pk, cfg=cfg)
                observed = replace(observed, over_budget=over_budget, now=talk.clock())
            elif decision.step is Step.COMMANDS:
                handled = await self._run_commands(decision.messages)
                rest = tuple(m for m in observed.messages if m.pk not in handled)
                observed = replace(observed, messages=rest, commands_ran=True, now=talk.clock())
            else:
                return decision

    async def _observe(self) -> Observation:
        self._news = False
        seen = await aobserve(
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

    async def _plannable(self, messages: list[Message], cfg: BotConfig | None = None) -> list[Message]:
        """Ignored chats and people, and commands of those who may not use them: stored, never planned;
        then the receive hooks."""
        return await receive_points(talk.plannable(messages, self.session, cfg)[0], self.session)

    async def _observe_more(self) -> list[Message]:
        return await self._plannable((await self._observe()).messages)

    def _remember(self, cycle: PlannerCycle) -> None:
        if self.history is not None:
            self.history.remember_cycle(cycle)
        self.cycles += 1

    async def _run_commands(self, messages: tuple[Message, ...]) -> set[int]:
        """Plugins' commands read the messages first; returns those they handled (never planned)."""
        self.busy = True
        handled, cycle = await run_commands(session=self.session, new_messages=list(messages))
        if cycle is not None:
            self._remember(cycle)
        return handled

    async def _answer_offline(self, decision: Decision) -> None:
        """No model, or its daily budget is spent: the offline planner answers (no model call)."""
        self.busy = True
        cycle = await run_offline_cycle(
            session=self.session,
            new_messages=list(decision.messages),
            mentioned=decision.mentioned,
            over_budget=decision.over_budget,
        )
        if cycle is not None:
            self._remember(cycle)

    async def _plan(self, decision: Decision, *, reason: str, observe_ms: float, cfg: BotConfig) -> None:
        """One cycle with the model; then the restraint and the one look after a silent private turn."""
        self.busy = True
        if self.history is None:
            self.history = planner.HistoryCache()
        result = await planner.run_cycle(
            session=self.session,
            new_messages=list(decision.messages),
            trigger=decision.trigger,
            mentioned=decision.mentioned,
            has_news=lambda: self._news,
            observe_more=self._observe_more,
            observe_ms=observe_ms,
            history_cache=self.history,
        )
        self._remember(result.cycle)
        self.talk_state, relook = after_cycle(
            self.talk_state,
            action=result.action,
            mentioned=decision.mentioned,
            private=self.session.is_private,
            reason=reason,
        )
        self.relook_at = self.loop.time() + cfg.chat.no_reply_timeout if relook else None
