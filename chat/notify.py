"""The one notifier: how this process wakes a session's runtime, the outbox deliverers (its own and the
other processes'), the dispatchers (scheduled work made due sooner than they knew), and a gateway in
another process whose connection was replaced here.

One backend per process, chosen once from settings (`get_notifier`; chosen again only when a test
changes REDIS_URL or CHANNEL_LAYERS):

* `LocalNotifier`, the embedded default (no REDIS_URL): in-process calls, and for the other ASGI
  processes sharing the database on this machine, their Unix datagram wake sockets (chat.wake); the
  dispatchers' sockets are in the wake directory's `dispatch/`. A connection replaced in another
  process is not reached (the processes do not talk).
* `ChannelLayerNotifier`, scale-out (REDIS_URL): the channel layer. Outbox wake-ups go to the group
  `OUTBOX_GROUP`, which every gateway's own channel joins, dispatcher wake-ups to `DISPATCH_GROUP`,
  which every dispatcher's own channel joins; `gateway.close` goes to the channel a connection's
  record names.

Session wake-ups go through the channel layer in both: each runtime joins its session's group (the
in-memory layer on the embedded default, so a wake reaches the runtimes of this process only).

A wake carries no data, only "look now": whoever is woken reads the database as always, and every
deliverer and dispatcher also looks after a long safety poll, so a lost wake-up costs at most that
poll, never a message. No other module asks whether Redis is configured.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from chat.services import outbound_created
from chat.session_runtime import WAKE, session_group
from chat.wake import WakeEndpoint, WakeInbox, wake_dir, wake_local
from core.aio import submit, wait_event

logger = logging.getLogger(__name__)

# The channel-layer group every gateway's channel joins: an `outbox.wake` sent to it wakes them all.
OUTBOX_GROUP = "maibot.outbox"
# The group every dispatcher's channel joins: a `dispatch.wake` sent to it wakes them all.
DISPATCH_GROUP = "maibot.dispatch"
# Group membership expires in channels_redis (group_expiry); a gateway joins again well before.
GROUP_REJOIN_SECONDS = 600
# How long closing a gateway's listener waits for its channel receive to end, and how long a process
# that exits waits for its outbox wake-ups still being published.
CLOSE_SECONDS = 5.0
FLUSH_SECONDS = 2.0


class Wakeable(Protocol):
    """The outbox deliverer as the notifier sees it: `wake()` is thread-safe."""

    def wake(self) -> None: ...


class GatewayEnd(Protocol):
    """A gateway as its listener sees it: its deliverer, its event loop, and what closes a connection
    that a newer one in another process replaced (called on `loop`)."""

    deliverer: Wakeable
    loop: asyncio.AbstractEventLoop | None

    def close_replaced(self, record_id: Any) -> None: ...


# This process's outbox deliverer (the running gateway's), woken directly by this process's writes.
_deliverer: Wakeable | None = None
_deliverer_lock = threading.Lock()


def _set_deliverer(deliverer: Wakeable | None, *, instead_of: Wakeable | None = None) -> None:
    """Make `deliverer` this process's; with `instead_of`, only if that one is this process's still."""
    global _deliverer
    with _deliverer_lock:
        if instead_of is None or _deliverer is instead_of:
            _deliverer = deliverer


def _wake_own_deliverer() -> None:
    deliverer = _deliverer
    if deliverer is not None:
        deliverer.wake()


class GatewayListener:
    """How one gateway is reached from other processes: opened when it starts, closed when it stops."""

    channel_name = ""  # what the gateway's connection records name (empty: not reachable by name)

    def __init__(self, gateway: GatewayEnd) -> None:
        self.gateway = gateway

    def open(self) -> str:
        """Start listening; returns how the gateway's outbox is woken (for the log)."""
        _set_deliverer(self.gateway.deliverer)
        return "polled"

    async def ready(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until other processes can reach the gateway."""
        return True

    async def close(self) -> None:
        _set_deliverer(None, instead_of=self.gateway.deliverer)


class Notifier:
    """The interface, and what both backends share (session wake-ups through the channel layer)."""

    name = ""

    def wake_outbox(self) -> None:
        """Sync, any thread: wake this process's deliverer and the other processes'. Never raises."""
        raise NotImplementedError

    def listen(self, gateway: GatewayEnd) -> GatewayListener:
        raise NotImplementedError

    def wake_dispatchers(self) -> None:
        """Sync, any thread: wake every dispatcher (this process's and the others'), after a write made
        scheduled work due sooner than they knew. Never raises."""
        raise NotImplementedError

    def dispatcher_inbox(self) -> DueInbox:
        """Where a dispatcher waits for `wake_dispatchers` (open it before the first look for work)."""
        raise NotImplementedError

    async def close_replaced_elsewhere(self, elsewhere: Iterable[tuple[int, str]]) -> None:
        """Ask the gateways holding these (record id, channel) connections to close them."""

    def outbox_poll_seconds(self, gateway_config: Any) -> float:
        """How often a deliverer polls besides its wake-ups (`gateway.outbox_poll_seconds[_with_redis]`)."""
        return gateway_config.outbox_poll_seconds

    async def wake_session(self, session_pk: int, reason: str, *, layer: BaseChannelLayer | None = None) -> bool:
        """Wake a session's live runtime wherever it runs: its group on the channel layer. False if no
        layer is configured."""
        layer = layer if layer is not None else get_channel_layer()
        if layer is None:
            return False
        await layer.group_send(session_group(session_pk), {"type": WAKE, "reason": reason})
        return True


class LocalNotifier(Notifier):
    """The embedded default: in-process, and the local wake sockets of the processes sharing the database."""

    name = "local"

    def wake_outbox(self) -> None:
        _wake_own_deliverer()
        wake_local()

    def listen(self, gateway: GatewayEnd) -> GatewayListener:
        return _SocketListener(gateway)

    def wake_dispatchers(self) -> None:
        wake_local(directory=dispatch_wake_dir())

    def dispatcher_inbox(self) -> DueInbox:
        return _SocketInbox(WakeInbox(dispatch_wake_dir()))


class _SocketListener(GatewayListener):
    """The gateway's wake socket (chat.wake), read on the gateway's loop."""

    endpoint: WakeEndpoint | None = None

    def open(self) -> str:
        super().open()
        self.endpoint = WakeEndpoint(lambda: self.gateway.deliverer.wake())
        return "woken locally" if self.endpoint.open(self.gateway.loop) else "polled"

    async def close(self) -> None:
        await super().close()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None


class ChannelLayerNotifier(Notifier):
    """Scale-out: the channel layer (Redis), shared by every process."""

    name = "channel layer"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future] = set()  # publishes on the background loop
        self._flush_registered = False

    def outbox_poll_seconds(self, gateway_config: Any) -> float:
        return gateway_config.outbox_poll_seconds_with_redis

    def listen(self, gateway: GatewayEnd) -> GatewayListener:
        return _ChannelListener(gateway)

    def dispatcher_inbox(self) -> DueInbox:
        return _ChannelInbox()

    def wake_dispatchers(self) -> None:
        for inbox in list(_channel_inboxes):
            inbox.wake()
        try:
            self._publish(DISPATCH_GROUP, "dispatch.wake")
        except Exception:
            logger.warning("could not publish the dispatcher wake-up", exc_info=True)

    async def close_replaced_elsewhere(self, elsewhere: Iterable[tuple[int, str]]) -> None:
        layer = get_channel_layer()
        for record_id, channel in elsewhere:
            await layer.send(channel, {"type": "gateway.close", "record_id": record_id})

    def wake_outbox(self) -> None:
        """The publish is handed to an event loop, never awaited: the running one when called on a loop,
        otherwise the process's background loop (a sync hook in a task worker, a management command, a
        server's worker thread). The channel layer keeps its connections per loop."""
        _wake_own_deliverer()
        try:
            self._publish(OUTBOX_GROUP, "outbox.wake")
        except Exception:
            logger.warning("could not publish the outbox wake-up", exc_info=True)

    def _publish(self, group: str, kind: str) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            task = running.create_task(self._send(group, kind))
            with self._lock:
                self._pending.add(task)
            task.add_done_callback(self._done)
            return
        future = submit(self._send(group, kind))
        with self._lock:
            self._pending.add(future)
            if not self._flush_registered:
                atexit.register(self._flush)
                self._flush_registered = True
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future | concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            # The rows are stored; pollers and the next wake deliver them. Never fail a send over this.
            logger.warning("could not publish a wake-up: %s", future.exception())

    def _flush(self) -> None:
        """At exit: a short-lived process (a management command) sends its wake-ups before the
        background loop's daemon thread dies with it."""
        with self._lock:
            pending = [f for f in self._pending if isinstance(f, concurrent.futures.Future)]
        for future in pending:
            with contextlib.suppress(Exception):
                future.result(timeout=FLUSH_SECONDS)

    @staticmethod
    async def _send(group: str, kind: str) -> None:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(group, {"type": kind})


class _ChannelListener(GatewayListener):
    """The gateway's own channel on the channel layer, received on the process's background loop.

    A channel of its own, not one of channels_redis' process-specific ("!") channels: those share one
    receive loop and buffer per process with the session runtimes' channels, where outbox wake-ups to
    the gateway were lost. The receive runs on the background loop, never the server's: a cancellation
    that arrives while channels_redis waits in its blocking pop is taken in only when that pop returns,
    or never. So closing does not cancel first: it sends the receive a `gateway.stop` on its own
    channel, which ends it at once and leaves the outbox group; only if that cannot be sent, or the
    receive does not end within CLOSE_SECONDS, is it cancelled."""

    def __init__(self, gateway: GatewayEnd) -> None:
        super().__init__(gateway)
        self.channel_name = f"gateway.{uuid.uuid4().hex}"
        self._ready = asyncio.Event()  # on the gateway's loop
        self.receive: concurrent.futures.Future | None = None

    def open(self) -> str:
        super().open()
        self.receive = submit(self._listen())
        return "woken via Redis"

    async def ready(self, timeout: float) -> bool:
        return await wait_event(self._ready, timeout)

    async def close(self) -> None:
        await super().close()
        receive, self.receive = self.receive, None
        if receive is None or receive.done():
            return
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await get_channel_layer().send(self.channel_name, {"type": "gateway.stop"})
            await asyncio.wait([asyncio.wrap_future(receive)], timeout=CLOSE_SECONDS)
        except Exception:
            logger.warning("could not ask the gateway's channel receive to stop; cancelling it", exc_info=True)
        if receive.done():
            return
        receive.cancel()
        await asyncio.to_thread(concurrent.futures.wait, [receive], CLOSE_SECONDS)
        if not receive.done():
            logger.warning("the gateway's channel receive did not end within %gs of its cancellation", CLOSE_SECONDS)

    def _in_gateway_loop(self, callback: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the gateway's loop has ended (a test's)
            self.gateway.loop.call_soon_threadsafe(callback, *args)

    async def _listen(self) -> None:
        """Outbox wake-ups from other processes, and `close` for replaced connections."""
        layer = get_channel_layer()
        join_at = float("-inf")  # at once (the monotonic clock counts from boot: 0.0 is no "long ago")
        while True:
            try:
                if time.monotonic() >= join_at:
                    await layer.group_add(OUTBOX_GROUP, self.channel_name)
                    join_at = time.monotonic() + GROUP_REJOIN_SECONDS
                    self._in_gateway_loop(self._ready.set)
                message = await layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                self.gateway.deliverer.wake()  # something may have been missed: look now
                join_at = float("-inf")  # Redis may have restarted without its groups: join again
                await asyncio.sleep(1)
                continue
            if message.get("type") == "outbox.wake":
                self.gateway.deliverer.wake()  # thread-safe
            elif message.get("type") == "gateway.close":
                self._in_gateway_loop(self.gateway.close_replaced, message.get("record_id"))
            elif message.get("type") == "gateway.stop":
                with contextlib.suppress(Exception):  # the membership expires anyway (group_expiry)
                    await layer.group_discard(OUTBOX_GROUP, self.channel_name)
                return


# --- where a dispatcher waits ----------------------------------------------------------------------


def dispatch_wake_dir() -> Path:
    """The local wake directory of the dispatchers of this database."""
    return wake_dir() / "dispatch"


class DueInbox(Protocol):
    """A dispatcher's wake-ups: `wait` returns True when woken (every wake-up waiting is taken), False
    after `timeout`; `wake` (thread-safe, this process) ends the current or the next wait."""

    def open(self) -> str: ...
    def wait(self, timeout: float) -> bool: ...
    def wake(self) -> None: ...
    def close(self) -> None: ...


class _SocketInbox:
    """The local wake socket in `dispatch_wake_dir()` (chat.wake.WakeInbox)."""

    def __init__(self, inbox: WakeInbox) -> None:
        self.inbox = inbox

    def open(self) -> str:
        return "woken locally" if self.inbox.open() else "polled"

    def wait(self, timeout: float) -> bool:
        return self.inbox.wait(timeout)

    def wake(self) -> None:
        self.inbox.wake()

    def close(self) -> None:
        self.inbox.close()


# This process's open channel inboxes: its own wake-ups reach them directly, as well as via Redis.
_channel_inboxes: set[_ChannelInbox] = set()


class _ChannelInbox:
    """A dispatcher's own channel on the channel layer, in DISPATCH_GROUP, received on the process's
    background loop (as `_ChannelListener`, and stopped the same way: a `dispatch.stop` on its channel)."""

    def __init__(self) -> None:
        self.channel_name = f"dispatch.{uuid.uuid4().hex}"
        self._woken = threading.Event()
        self._joined = threading.Event()
        self.receive: concurrent.futures.Future | None = None

    def open(self) -> str:
        _channel_inboxes.add(self)
        self.receive = submit(self._listen())
        if not self._joined.wait(CLOSE_SECONDS):
            logger.warning("the dispatcher's channel did not join %s within %gs", DISPATCH_GROUP, CLOSE_SECONDS)
        return "woken via Redis"

    def wait(self, timeout: float) -> bool:
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        _channel_inboxes.discard(self)
        receive, self.receive = self.receive, None
        if receive is None or receive.done():
            return

        async def stop() -> None:
            await get_channel_layer().send(self.channel_name, {"type": "dispatch.stop"})

        try:
            submit(stop()).result(CLOSE_SECONDS)
            receive.result(CLOSE_SECONDS)
        except Exception:
            logger.warning("could not stop the dispatcher's channel receive; cancelling it", exc_info=True)
            receive.cancel()

    async def _listen(self) -> None:
        layer = get_channel_layer()
        join_at = float("-inf")  # at once (the monotonic clock counts from boot: 0.0 is no "long ago")
        while True:
            try:
                if time.monotonic() >= join_at:
                    await layer.group_add(DISPATCH_GROUP, self.channel_name)
                    join_at = time.monotonic() + GROUP_REJOIN_SECONDS
                    self._joined.set()
                message = await layer.receive(self.channel_name)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("channel layer receive failed; retrying")
                self._woken.set()  # something may have been missed: look now
                join_at = float("-inf")  # Redis may have restarted without its groups: join again
                await asyncio.sleep(1)
                continue
            if message.get("type") == "dispatch.wake":
                self._woken.set()
            elif message.get("type") == "dispatch.stop":
                with contextlib.suppress(Exception):
                    await layer.group_discard(DISPATCH_GROUP, self.channel_name)
                return


_notifier: Notifier | None = None


def get_notifier() -> Notifier:
    """This process's notifier: the channel layer with REDIS_URL set, else the local one."""
    global _notifier
    if _notifier is None:
        _notifier = ChannelLayerNotifier() if settings.REDIS_URL else LocalNotifier()
    return _notifier


@receiver(setting_changed, dispatch_uid="chat.notify.settings")
def _on_setting_changed(setting: str, **kwargs) -> None:
    global _notifier
    if setting in ("REDIS_URL", "CHANNEL_LAYERS"):
        _notifier = None


@receiver(outbound_created, dispatch_uid="chat.outbox.wake")
def _on_outbound_created(sender, messages, **kwargs) -> None:
    get_notifier().wake_outbox()
