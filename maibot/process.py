"""What every long-running process (the ASGI server, the cluster) runs beside its real work: the config
watcher, the database log handler and the heartbeat. Never started by management commands or tests
unless they ask for it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from maibot import datadir, logdb
from maibot.config import get_config
from maibot.reload import ConfigWatcher

logger = logging.getLogger(__name__)


class Heartbeat:
    """Writes this process's ProcessHeartbeat row every `console.heartbeat_seconds`; deletes it on stop
    so /healthz sees a stopped cluster at once rather than after the staleness window."""

    def __init__(self, role: str, alive: Callable[[], bool] | None = None) -> None:
        self.role = role
        self.alive = alive
        self.name = f"{socket.gethostname()}:{os.getpid()}"[:128]
        self.started_at = timezone.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"maibot-heartbeat-{role}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        from maibot.models import ProcessHeartbeat

        if self.alive is not None and not self.alive():
            # A stuck part (e.g. the dispatcher thread died): stop vouching, let /healthz go stale.
            logger.error("%s %s: a vital thread is down; heartbeat withheld", self.role, self.name)
            return
        now = timezone.now()
        ProcessHeartbeat.objects.update_or_create(
            name=self.name, defaults={"role": self.role, "started_at": self.started_at, "beat_at": now}
        )
        # Rows of processes that died without saying goodbye.
        ProcessHeartbeat.objects.filter(beat_at__lt=now - timedelta(days=1)).delete()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception:
                logger.exception("heartbeat of %s failed", self.name)
                close_old_connections()
            self._stop.wait(get_config().console.heartbeat_seconds)
        try:
            from maibot.models import ProcessHeartbeat

            ProcessHeartbeat.objects.filter(name=self.name).delete()
        except Exception:
            logger.exception("could not remove the heartbeat of %s", self.name)
        finally:
            close_old_connections()

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        self._thread.join(timeout)


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
        self.heartbeat = Heartbeat(self.role, self.alive).start()
        self.watcher = ConfigWatcher().start()
        logger.info("%s process %s: console services started", self.role, os.getpid())
        return self

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
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
    far (Django, the apps, their libraries: ~140,000-190,000 objects, loaded at import and kept for the
    process's life) out of its sight, after one collection of what is garbage already, and collect the
    young generation every 10,000 net allocations instead of 700.

    Why (bench/ingest.py, bench/sessions.py, a 2-core machine): each full collection walked that
    start-up heap, 80-130 ms with the event loop stopped, and under an ingest burst they came every
    ~0.5 s: a lone message sent then waited up to 200 ms, and the collector took about a third of the
    server's CPU per message. At 700 a burst's batches (parsed frames, rows, model instances, alive
    while their transaction runs) outlived enough young collections to be promoted, and the promoted
    objects set off the full collections; at 10,000 they die young. Measured: a 20,000 burst went from
    6 full collections (11-54 ms each once frozen) to none, and its collector time from ~250 to ~80 ms;
    10,000 sessions at 50/s from 13-14 full collections (up to 190-290 ms) to none. A young collection
    now walks up to 10,000 objects (~1-2 ms). The cost of the freeze: an object frozen here that later
    becomes garbage in a reference cycle is never freed (reference counting still frees the rest); what
    is loaded at import is meant to stay.
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
