"""The outbox's deliverer, one per ASGI process: it claims the pending outbound rows this process can
deliver (chat.outbox_rows, on the claim machine chat.claims), hands their frames to the connected
adapter (or browser) of their platform as the delivery gate lets it (chat.delivery_gate), and marks the
outcome. A claimer hands a claimed row to a socket only while its heartbeat vouches for the claim (a
server paused past its heartbeat, then resumed, hands over nothing it may have lost meanwhile).

Wake-ups: the send service's `outbound_created` signal wakes this process's deliverer at once, and the
other processes' through the notifier (chat.notify: the channel layer, or the local wake sockets); an
adapter (re)connecting or answering wakes it too, and so does another process's heartbeat running out
(core.process.on_peer_death: its claims are taken back at once). Otherwise it sleeps until the next
instant the rows say something is due (a confirm deadline, a redelivery backoff, a lease, an offline
expiry: chat.outbox_rows.outbox_next_due). It never polls: `gateway.outbox_poll_seconds`
(`_with_redis`) and `outbox_sweep_seconds` (30 s) are only the safety net for a lost wake-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from chat import events
from chat.delivery_errors import DeliveryError
from chat.delivery_gate import DeliveryGate, confirm_window, outbox_confirm_overdue, outbox_unanswered_probes
from chat.models import Message
from chat.notify import get_notifier
from chat.outbox_rows import (
    BATCH_SIZE,
    WEB_PLATFORM,
    Answered,
    Delivery,
    outbox_claim,
    outbox_finish,
    outbox_next_due,
    outbox_sweep,
)
from core.aio import db, wait_event
from core.config import get_config
from core.process import Heartbeat, heartbeat_acquire, heartbeat_release, on_peer_death

logger = logging.getLogger(__name__)


# --- the deliverer (async, in the ASGI process) ---------------------------------------------------


class Sink:
    """Where a claimed row goes: the registry of live connections in this process (chat.gateway)."""

    def web_users(self) -> Collection[str]: ...
    def accept_formats(self) -> Mapping[str, list[str]]:
        """What each platform accepts, live: the claim reads it when it builds the frames, after its
        rows are read, so a row written after an adapter said what it accepts is built accordingly."""
        ...

    async def deliver(self, delivery: Delivery) -> bool | Answered:
        """Write the frame; False when the connection is gone (the row waits again). An adapter that
        answers the hand-over gives its answer, which is the row's fate."""
        ...


@dataclass
class HandOver:
    """What became of a claimed batch's rows in one round."""

    sent: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    failed: dict[int, DeliveryError] = field(default_factory=dict)
    answered: dict[int, Answered] = field(default_factory=dict)  # by an adapter that answers (Answered)
    gone: set[tuple[str, str]] = field(default_factory=set)  # (platform, browser user) whose socket failed
    lapsed: bool = False  # the heartbeat stopped vouching for the claim midway


class Deliverer:
    """One task per ASGI process: claims deliverable rows and writes them, in order, to the sockets
    `sink` holds, as far as `gate` (the process's delivery gate) lets them."""

    def __init__(self, sink: Sink, gate: DeliveryGate) -> None:
        self.sink = sink
        self.gate = gate
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # One thread keeps one database connection for the deliverer's short statements.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        self._claim = db(outbox_claim, executor=self.executor)
        self._finish = db(outbox_finish, executor=self.executor)
        self._sweep = db(outbox_sweep, executor=self.executor)
        self._next_due_at = db(outbox_next_due, executor=self.executor)
        self._overdue = db(outbox_confirm_overdue, executor=self.executor)
        self._unanswered = db(outbox_unanswered_probes, executor=self.executor)
        self.sent_total = 0
        self.rounds = 0  # claim rounds run (tests wait for rounds to prove that nothing was handed over)
        # The loop time of the earliest confirm deadline of a row this process handed over: the
        # deliverer looks again then, not only at its next poll.
        self._next_deadline = float("inf")
        # When the rows next need a look (loop time; `_look_ahead`), and the next sweep: nothing polls.
        self._next_due = float("inf")
        self._sweep_at = float("-inf")  # the first round sweeps
        self._sweep_now = False  # another process died: sweep at the next round
        self._swept_wall = datetime.min.replace(tzinfo=UTC)
        # This process's heartbeat, which vouches for its claims (held while run() runs).
        self.heartbeat: Heartbeat | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the deliverer runs on (None before it starts)."""
        return self._loop

    def wake(self) -> None:
        """Thread-safe: deliver now rather than at the next poll."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._event.set()
        else:
            loop.call_soon_threadsafe(self._event.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Beating before the first claim: a claim is only as good as the heartbeat that vouches for it.
        acquiring = asyncio.ensure_future(asyncio.to_thread(heartbeat_acquire, "web"))
        try:
            self.heartbeat = await asyncio.shield(acquiring)
            await self._rounds()
        finally:
            self.heartbeat = None
            # Released once acquired, also when the deliverer is stopped during the first beat.
            await asyncio.shield(self._release_heartbeat(acquiring))

    @staticmethod
    async def _release_heartbeat(acquiring: asyncio.Future) -> None:
        try:
            await acquiring
        except Exception:
            return  # never acquired
        await asyncio.to_thread(heartbeat_release)

    async def _rounds(self) -> None:
        swept_at = float("-inf")  # loop time of the last sweep
        forget = on_peer_death(self._peer_died)
        try:
            while True:
                await self._sleep(swept_at)
                try:
                    if self._sweep_now or self._loop.time() >= self._sweep_at:
                        self._sweep_now = False
                        swept_at = self._loop.time()
                        self._swept_wall = timezone.now()
                        self._sweep_at = swept_at + get_config().gateway.outbox_sweep_seconds
                        await self._sweep()
                    while await self._round():
                        pass
                    await self._look_ahead()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("outbox round failed; retrying shortly")
                    await asyncio.sleep(1)
        finally:
            forget()

    async def _sleep(self, swept_at: float) -> None:
        """Until a wake-up, the next instant the rows say something is due (`_look_ahead`), or the safety
        polls (`gateway.outbox_poll_seconds[_with_redis]`, `outbox_sweep_seconds`)."""
        config = get_config().gateway  # read each round: a reload applies without a restart
        poll = get_notifier().outbox_poll_seconds(config)
        now = self._loop.time()
        self._sweep_at = min(self._sweep_at, swept_at + config.outbox_sweep_seconds)
        wait = min(poll, self._next_deadline - now, self._next_due - now, self._sweep_at - now)
        await wait_event(self._event, max(0.0, wait))
        self._event.clear()

    def _peer_died(self) -> None:
        """From the heartbeat's thread: another process died; its claims are to be taken back now."""
        self._sweep_now = True
        self.wake()

    async def _look_ahead(self) -> None:
        """Read when the rows next need this deliverer (chat.outbox_rows.outbox_next_due), in loop time."""
        wall, loop_now = timezone.now(), self._loop.time()
        due = await self._next_due_at(swept_at=self._swept_wall, now=wall)
        self._next_due = float("inf") if due.round is None else loop_now + (due.round - wall).total_seconds()
        if due.sweep is not None:
            self._sweep_at = min(self._sweep_at, loop_now + (due.sweep - wall).total_seconds())

    async def _round(self) -> bool:
        """Settle overdue confirms, claim what this process may deliver, hand it over, mark it. True
        when a full batch went out (claim again at once)."""
        self.rounds += 1
        if self._loop.time() >= self._next_deadline:
            self._next_deadline = float("inf")
        await self._settle_overdue()
        echoing = set(self.gate.confirming_platforms())  # its rows await an echo once handed over
        platforms = list(self.gate.adapter_platforms())
        probing = list(self.gate.probing_platforms())
        users = list(self.sink.web_users())
        if not platforms and not users and not probing:
            return False
        epoch = self.heartbeat.vouch() if self.heartbeat is not None else None
        if epoch is None:
            # No claim this process cannot vouch for (the heartbeat logs why it lapsed): look again after
            # a beat, when it may vouch again; nothing else would wake this deliverer for these rows.
            self._look_again_after_a_beat()
            return False
        token, batch = await self._claim(
            adapter_platforms=platforms,
            web_users=users,
            probing=probing,
            accept_formats=self.sink.accept_formats(),
        )
        if not batch:
            return False
        # The hand-over time recorded (sent_at, and the confirm deadline counted from it): taken before
        # the first frame is written, so no echo of this batch can carry an earlier time.
        handed_at = timezone.now()
        done = HandOver()
        try:
            await self._hand_over(batch, epoch, done)
        finally:
            awaiting = await asyncio.shield(self._mark(token, batch, done, echoing, handed_at))
        if awaiting:
            first = min(confirm_window(d.attempts) for d in awaiting)
            self._next_deadline = min(self._next_deadline, self._loop.time() + first)
        if done.lapsed:
            self._look_again_after_a_beat()
            logger.warning(
                "outbox: this server's heartbeat no longer vouched for its claim; %d claimed messages not "
                "handed over (they go to whoever holds them now, or wait for a later round)",
                len(done.released),
            )
        handed = done.sent + [i for i, answer in done.answered.items() if answer.ok]
        self.sent_total += len(handed)
        if handed:
            events.emit_background(events.Point.AFTER_SEND, lambda: _after_send_kwargs(handed))
        # Again at once after a full batch; and while a platform is probing (one row per round), after a row
        # that failed before its hand-over: the probe was not spent, the next row may take it now.
        again = len(batch) >= BATCH_SIZE or bool(probing and done.failed)
        return again and not done.gone and not done.lapsed

    def _look_again_after_a_beat(self) -> None:
        interval = self.heartbeat.interval if self.heartbeat is not None else get_config().console.heartbeat_seconds
        self._next_deadline = min(self._next_deadline, self._loop.time() + interval)

    async def _settle_overdue(self) -> None:
        """Rows past their confirm deadline, before anything is claimed (an indexed query, only while a
        platform that echoes is connected here, or an unproven one's probe is out): an unproven
        platform's unanswered probe shows that it never echoes; other such rows go back (or are
        unconfirmed)."""
        checking = set(self.gate.overdue_platforms())
        if not checking:
            return
        concluding = set(self.gate.concluding_platforms())
        if concluding:
            silent = await self._unanswered(platforms=concluding)
            if silent:
                self.gate.never_echoes(silent)
        if checking - concluding:
            overdue = await self._overdue(platforms=checking - concluding)
            if overdue:
                self.gate.confirm_missed(overdue)

    async def _hand_over(self, batch: list[Delivery], epoch: int, done: HandOver) -> None:
        for delivery in batch:
            key = (delivery.platform, delivery.user_id if delivery.platform == WEB_PLATFORM else "")
            if done.lapsed or not self.heartbeat.vouches(epoch):
                # The claim may have been taken back meanwhile (this process was paused, or its
                # heartbeat failed, past the point where the others count it dead): hand over
                # nothing more of it. The release is conditional on the claim, like every mark.
                done.lapsed = True
                done.released.append(delivery.message_id)
            elif delivery.error:
                done.failed[delivery.message_id] = delivery.error
            elif key in done.gone:
                # Keep per-session order: once a connection fails, the rest of its rows wait.
                done.released.append(delivery.message_id)
            elif isinstance(outcome := await self.sink.deliver(delivery), Answered):
                done.answered[delivery.message_id] = outcome
                if not outcome.ok:
                    done.gone.add(key)  # the rest of its rows wait for the retry, in order
            elif outcome:
                done.sent.append(delivery.message_id)
            else:
                done.gone.add(key)
                done.released.append(delivery.message_id)

    async def _mark(
        self, token: str, batch: list[Delivery], done: HandOver, echoing: set[str], handed_at: datetime
    ) -> list[Delivery]:
        """Record the round's outcome (rows not reached, when the round was cut short, wait again); the
        deliveries now awaiting an echo."""
        reached = set(done.sent) | set(done.released) | set(done.failed) | set(done.answered)
        done.released.extend(d.message_id for d in batch if d.message_id not in reached)
        handed = set(done.sent)
        platform_of = {d.message_id: d.platform for d in batch}
        awaiting = [d for d in batch if d.platform in echoing and d.message_id in handed]
        await self._finish(
            token=token,
            sent=done.sent,
            released=done.released,
            failed=done.failed,
            awaiting_echo=[d.message_id for d in awaiting],
            answered={i: (platform_of[i], answer) for i, answer in done.answered.items()},
            now=handed_at,
        )
        return awaiting


def _after_send_kwargs(message_ids: list[int]) -> list[dict[str, Any]]:
    """The `send_service.after_send` kwargs of messages just handed over (read in the emitter's thread)."""
    rows = Message.objects.select_related("session").filter(pk__in=message_ids).order_by("id")
    return [{"message": m, "session": m.session} for m in rows]


# --- wake-ups from the send service -------------------------------------------------------------
