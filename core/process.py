"""What every long-running process (the ASGI server, the cluster) runs beside its real work: the config
watcher, the database log handler and the heartbeat (which also vouches for the process's claims of
work). Never started by management commands or tests unless they ask for it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import DurationField, Value
from django.db.models.functions import Now
from django.utils import timezone

from core import datadir, logdb
from core.config import get_config
from core.reload import ConfigWatcher

logger = logging.getLogger(__name__)


# A process whose heartbeat is this many intervals old counts as dead (three beats missed in a row).
DEAD_AFTER_BEATS = 4
# How long acquiring the heartbeat waits for its first beat.
FIRST_BEAT_SECONDS = 10.0

# Called (from the heartbeat's thread) when a beat finds a process newly dead: its claims can be taken
# back now. The dispatcher and the outbox wait for wake-ups rather than polling, and a dead process
# wakes no one: this is how they learn of it within a beat.
_peer_death_listeners: list[Callable[[], None]] = []


def on_peer_death(listener: Callable[[], None]) -> Callable[[], None]:
    """Call `listener` (thread-safe, quick, never raising) whenever a beat finds another process's
    heartbeat newly run out; returns a function that removes it."""
    _peer_death_listeners.append(listener)
    return lambda: _peer_death_listeners.remove(listener) if listener in _peer_death_listeners else None


def _tell_peer_death() -> None:
    for listener in list(_peer_death_listeners):
        try:
            listener()
        except Exception:
            logger.exception("peer death listener failed")


def instance_id() -> str:
    """This process's identity in its heartbeat row and in the claims it makes: new in every process
    (a forked child gets its own), never reused."""
    global _instance
    pid = os.getpid()
    if _instance is None or _instance[0] != pid:
        _instance = (pid, uuid.uuid4().hex)
    return _instance[1]


_instance: tuple[int, str] | None = None


class Heartbeat:
    """This process's sign of life: its ProcessHeartbeat row, written every `console.heartbeat_seconds`
    from a thread of its own (a busy event loop or a long round does not delay it), and deleted on stop
    so /healthz sees a stopped cluster at once rather than after the staleness window.

    Each beat sets `alive_until` to the database's now plus DEAD_AFTER_BEATS intervals; past it the other
    processes take this one's claims back (chat.claims.dead_claimers). So a process may act on a claim
    (hand a claimed message to a socket) only while it *vouches*: its last beat started less than
    DEAD_AFTER_BEATS - 1 intervals ago by its own monotonic clock (one interval to spare, for clock drift
    and the instant between the check and the write), and no beat has come too late since the claim was
    made. A beat that completes after that window had closed starts a new epoch: claims made before it
    may have been taken back meanwhile (the process was paused, or its database writes stalled), and `vouches`
    refuses them."""

    def __init__(
        self,
        role: str,
        alive: Callable[[], bool] | None = None,
        instance: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.role = role
        self.monotonic = monotonic  # injected by tests that pause the process
        self.alive = alive
        self.instance = instance or instance_id()
        self.name = f"{socket.gethostname()}:{os.getpid()}"[:128]
        self.started_at = timezone.now()
        self.interval = get_config().console.heartbeat_seconds
        self._lock = threading.Lock()
        self._dead_seen: set[str] = set()  # instances whose heartbeat had run out at the last beat
        self._epoch = 0
        self._valid_until = float("-inf")  # monotonic
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"maibot-heartbeat-{role}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> bool:
        """Write the row (False when withheld: a vital part of the process is down)."""
        from core.models import ProcessHeartbeat

        if self.alive is not None and not self.alive():
            # A stuck part (e.g. the dispatcher thread died): stop vouching, let /healthz go stale and
            # the other processes take this one's claims back.
            logger.error("%s %s: a vital thread is down; heartbeat withheld", self.role, self.name)
            return False
        interval = get_config().console.heartbeat_seconds
        dead_after = interval * DEAD_AFTER_BEATS
        began = self.monotonic()
        alive_until = Now() + Value(timedelta(seconds=dead_after), output_field=DurationField())
        rows = ProcessHeartbeat.objects.filter(instance=self.instance)
        if not rows.update(beat_at=Now(), alive_until=alive_until):
            ProcessHeartbeat.objects.create(
                instance=self.instance,
                name=self.name,
                role=self.role,
                started_at=self.started_at,
                beat_at=Now(),
                alive_until=alive_until,
            )
        with self._lock:
            if self.monotonic() >= self._valid_until:
                self._epoch += 1
            self._valid_until = began + dead_after - interval
            self.interval = interval
        # Rows of processes that died without saying goodbye.
        ProcessHeartbeat.objects.filter(
            beat_at__lt=Now() - Value(timedelta(days=1), output_field=DurationField())
        ).delete()
        self._look_for_dead_peers()
        return True

    def _look_for_dead_peers(self) -> None:
        """Tell the peer-death listeners when a process's heartbeat has run out since the last beat
        (every one counts as new at the first beat): one small query per beat, on a thread that wakes
        anyway."""
        from core.models import ProcessHeartbeat

        dead = set(ProcessHeartbeat.objects.filter(alive_until__lt=Now()).values_list("instance", flat=True))
        new, self._dead_seen = dead - self._dead_seen, dead
        if new:
            _tell_peer_death()

    def vouch(self) -> int | None:
        """The epoch to hold claims made now under (pass it to `vouches`), or None while this process
        cannot vouch for a claim (no beat yet, or its beats have lapsed)."""
        with self._lock:
            return self._epoch if self.monotonic() < self._valid_until else None

    def vouches(self, epoch: int | None) -> bool:
        """True while a claim made under `epoch` is still surely this process's."""
        with self._lock:
            return epoch is not None and epoch == self._epoch and self.monotonic() < self._valid_until

    def wait_first_beat(self, timeout: float = FIRST_BEAT_SECONDS) -> bool:
        """Wait until the first beat was tried (True if it was)."""
        return self._first.wait(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception:
                logger.exception("heartbeat of %s failed", self.name)
                _drop_connection()
            self._first.set()
            self._stop.wait(self.interval)
        try:
            from core.models import ProcessHeartbeat

            ProcessHeartbeat.objects.filter(instance=self.instance).delete()
        except Exception:
            logger.exception("could not remove the heartbeat of %s", self.name)
        finally:
            _drop_connection()

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        self._thread.join(timeout)


def _drop_connection() -> None:
    """Close this thread's database connection, whatever state it is in: the next beat opens a new one
    (close_old_connections would try to reach a database that is down, and raise, ending the thread)."""
    with contextlib.suppress(Exception):
        connection.close()


_heartbeat: Heartbeat | None = None
_heartbeat_users = 0
_heartbeat_lock = threading.Lock()


def heartbeat_acquire(role: str, alive: Callable[[], bool] | None = None) -> Heartbeat:
    """This process's heartbeat, started by its first user (the gateway's deliverer, the cluster's
    dispatcher, the console services) once its first beat was tried; `heartbeat_release` by each user
    stops it after the last. `alive` (the cluster's vital parts) is kept from whichever user gives it."""
    global _heartbeat, _heartbeat_users
    with _heartbeat_lock:
        if _heartbeat is None:
            _heartbeat = Heartbeat(role, alive).start()
        elif alive is not None:
            _heartbeat.alive = alive
        _heartbeat_users += 1
        heartbeat = _heartbeat
    heartbeat.wait_first_beat()
    return heartbeat


def heartbeat_release(*, all_users: bool = False) -> None:
    """One user is done with the heartbeat (`all_users`: every user, e.g. when a test ends with an event
    loop closed under a deliverer that never got to release its hold)."""
    global _heartbeat, _heartbeat_users
    with _heartbeat_lock:
        _heartbeat_users = 0 if all_users else _heartbeat_users - 1
        if _heartbeat_users > 0 or _heartbeat is None:
            return
        heartbeat, _heartbeat = _heartbeat, None
    heartbeat.stop()


class ProcessServices:
    def __init__(self, role: str, alive: Callable[[], bool] | None = None) -> None:
        self.role = role
        self.alive = alive
        self.watcher: ConfigWatcher | None = None
        self.heartbeat: Heartbeat | None = None

    def start(self) -> ProcessServices:
        # The one start every server and cluster goes through: a data dir made before is put right here.
        datadir.make_private(settings.DATA_DIR)
        logdb.activate(self.role)
        # The heartbeat first: arming the watcher can take seconds, and /healthz must not call a
        # running process dead meanwhile.
        self.heartbeat = heartbeat_acquire(self.role, self.alive)
        self.watcher = ConfigWatcher().start()
        logger.info("%s process %s: console services started", self.role, os.getpid())
        return self

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat = None
            heartbeat_release()
        if self.watcher is not None:
            self.watcher.stop()
        logdb.shutdown()


_started: ProcessServices | None = None
_start_lock = threading.Lock()


def start_process_services(role: str, alive: Callable[[], bool] | None = None) -> ProcessServices:
    """Start the watcher, the log handler and the heartbeat for this process (once). `alive` says
    whether the process's vital parts still run; the heartbeat is withheld while it is false."""
    global _started
    with _start_lock:
        if _started is None:
            _started = ProcessServices(role, alive).start()
        return _started


def stop_process_services() -> None:
    global _started
    with _start_lock:
        if _started is not None:
            _started.stop()
            _started = None


def call_before_server_shutdown(loop: asyncio.AbstractEventLoop, hook: Callable[[], Awaitable[object]]) -> bool:
    """Under daphne (Twisted's asyncio reactor driving `loop`), await `hook()` on the reactor's "before
    shutdown" trigger, so the server waits for it before its event loop stops. False when `loop` is not
    daphne's (tests, the bench, other servers): the caller then stops its work itself."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or getattr(reactor, "_asyncioEventloop", None) is not loop:
        return False
    from twisted.internet import defer

    def _trigger():
        return defer.Deferred.fromFuture(asyncio.ensure_future(hook(), loop=loop))

    reactor.addSystemEventTrigger("before", "shutdown", _trigger)
    return True


def tune_garbage_collector() -> None:
    """Set the garbage collector up for a long-running server: move every object the process has so
    far (Django, the apps, their libraries, loaded at import and kept for the process's life) out of its
    sight, after one collection of what is garbage already, and collect the young generation every
    10,000 net allocations instead of 700.

    So a full collection never walks the start-up heap (each one stops the event loop), and a batch's
    objects (parsed frames, rows, model instances, alive while their transaction runs) die young instead
    of being promoted and setting off full collections. The measurements behind both settings are in
    docs/benchmarks.md ("The garbage collector's settings"). The cost of the freeze: an object frozen
    here that later becomes garbage in a reference cycle is never freed (reference counting still frees
    the rest); what is loaded at import is meant to stay.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def start_services_on_first_call(app):
    """Wrap the ASGI application so the server process starts its services when it first serves
    (importing maibot.asgi alone, as tests do, starts nothing). settings.MAIBOT_CONSOLE_SERVICES turns
    this off."""
    from django.conf import settings

    started = False

    async def wrapper(scope, receive, send):
        nonlocal started
        if not started:
            started = True
            if getattr(settings, "MAIBOT_CONSOLE_SERVICES", True):
                # In the background: the first request must not wait for the watcher to arm.
                threading.Thread(target=start_process_services, args=("web",), daemon=True).start()
        return await app(scope, receive, send)

    return wrapper
