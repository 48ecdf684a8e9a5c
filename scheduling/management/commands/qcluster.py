"""`manage.py qcluster`: django-q2's cluster plus our dispatcher thread in the same process.

django-q2 checks its Schedule rows only every 30 s; scheduled messages and timers must go out well
under a second late, so the dispatcher (scheduling.dispatcher) runs beside the cluster instead. The
cluster's workers are forked on demand (scheduling.taskqueue.OnDemandSentinel in place of django-q2's).
"""

import contextlib
import logging
import os
import signal
import threading
import time
from multiprocessing import connection as mp_connection

from django.conf import settings
from django.db import connections
from django_q import cluster as q_cluster
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as DjangoQCommand

from core.process import (
    heartbeat_acquire,
    heartbeat_release,
    start_process_services,
    stop_process_services,
    tune_garbage_collector,
)
from scheduling.dispatcher import Dispatcher
from scheduling.taskqueue import OnDemandSentinel, wake_task_queue

# django-q2's Cluster.start forks whatever this name holds as its sentinel.
q_cluster.Sentinel = OnDemandSentinel

logger = logging.getLogger(__name__)


def _store_worker_logs(sender, proc_name: str, **kwargs) -> None:
    from core import logdb

    logdb.activate("cluster")


class Command(DjangoQCommand):
    help = "Starts the django-q2 cluster and the maibot dispatcher (scheduled messages, timers)."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--no-dispatcher", action="store_true", help="Run only django-q2's workers, no dispatcher.")

    def handle(self, *args, **options) -> None:
        settings.SECRET_KEY  # noqa: B018 - django-q2 signs tasks with it; fail early when unset
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        if settings.MAIBOT_CONSOLE_SERVICES:
            # Workers are forked before this process starts its log writer: each worker starts its
            # own when it is ready, so task logs (life-loop turns...) reach the live log page too.
            from django_q.signals import post_spawn

            post_spawn.connect(_store_worker_logs, dispatch_uid="maibot-worker-logs")
        # The cluster forks: no database connection may be shared across the fork.
        connections.close_all()
        # What is loaded now lives as long as the process (and its forked workers share it): out of
        # the garbage collector's sight (core.process.tune_garbage_collector).
        import scheduling.sources  # noqa: F401 - the timer source registers itself with the dispatcher

        tune_garbage_collector()
        cluster = Cluster()
        _stop_on_signal(cluster)
        cluster.start()
        if options.get("run_once"):
            cluster.stop()
            return
        _BesideTheCluster(cluster, dispatch=not options.get("no_dispatcher")).run()


def _stop_on_signal(cluster: Cluster) -> None:
    """SIGTERM/SIGINT stop the cluster from a thread of ours, never from the signal handler.

    django-q2's own handler (Cluster.sig_handler) stops and joins the sentinel on the main thread, in
    the middle of whatever that thread was doing: a signal while Cluster.start polls its start event
    (holding the event's lock) leaves the sentinel blocked setting that event and the handler joining
    the sentinel, for ever. Here the handler only starts the stopper: it sets the stop event once the
    cluster has one (a signal can come before Cluster.start made it), then wakes the pusher (waiting on
    an empty queue, scheduling.taskqueue) until the sentinel has ended, so it sees the stop at once.
    The main thread, joining the sentinel (_BesideTheCluster.run), carries on from there."""
    requested = threading.Event()

    def stopping() -> None:
        while True:
            try:
                # Ready when the sentinel process ends, without reaping it (the main thread's join does).
                ended = cluster.sentinel.sentinel
                break
            except (AttributeError, ValueError):  # not started yet (Cluster.start makes the stop event first)
                time.sleep(0.05)
        cluster.stop_event.set()
        logger.info("Q Cluster %s stopping.", cluster.name)
        while not mp_connection.wait([ended], timeout=0.2):
            wake_task_queue()

    def on_signal(signum, frame) -> None:
        if not requested.is_set():
            requested.set()
            threading.Thread(target=stopping, name="maibot-cluster-stopper", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _until_ended(sentinel) -> None:
    """Block the main thread until the sentinel process ends (then reap it), while letting signal
    handlers run: the kernel may deliver SIGTERM to any of the process's threads (the config watcher's,
    the dispatcher's...), and then a main thread blocked in join() (waitpid) is never interrupted to run
    the Python handler. With a wake-up fd, the signal's C handler writes to a pipe, whichever thread it
    lands on, and the main thread, waiting on the pipe and the sentinel's handle, returns to run it."""
    if sentinel is None:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        while sentinel.is_alive():  # reaps it once ended
            mp_connection.wait([sentinel.sentinel, read_end])
            with contextlib.suppress(BlockingIOError):
                os.read(read_end, 512)  # the signal's handler runs as this thread returns to Python code
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)


class _BesideTheCluster:
    """What runs in the cluster's main process beside it, started after the fork (so the cluster's
    children never inherit these threads): the heartbeat, the dispatcher thread, and with console
    services the log writer and the config watcher. The heartbeat vouches for the sentinel and the
    dispatcher, not just this process."""

    def __init__(self, cluster: Cluster, *, dispatch: bool) -> None:
        self.cluster = cluster
        self.dispatch = dispatch
        self.dispatcher: Dispatcher | None = None
        self.thread: threading.Thread | None = None
        self.services: threading.Thread | None = None

    def alive(self) -> bool:
        sentinel_ok = self.cluster.sentinel is not None and self.cluster.sentinel.is_alive()
        # A dispatcher thread not started yet (ident None) is not a dead one.
        thread = self.thread
        return sentinel_ok and (thread is None or thread.ident is None or thread.is_alive())

    def run(self) -> None:
        """Until the cluster's sentinel ends (SIGINT/SIGTERM stop it, _stop_on_signal); then stop what
        was started."""
        try:
            self.start()
            _until_ended(self.cluster.sentinel)
            logger.info("Q Cluster %s has stopped.", self.cluster.name)
        finally:
            self.stop()

    def start(self) -> None:
        if settings.MAIBOT_CONSOLE_SERVICES:
            # Store log lines for the console from the start (cheap: one writer thread), so the
            # dispatcher's own start-up line reaches the live log page too.
            from core import logdb

            logdb.activate("cluster")
        # The heartbeat always runs (whatever MAIBOT_CONSOLE_SERVICES says): when it stops, the other
        # clusters take back this one's claims within seconds. Its first beat comes before any claim.
        heartbeat_acquire("cluster", self.alive)
        if self.dispatch:
            self.dispatcher = Dispatcher()
            self.thread = threading.Thread(target=self.dispatcher.run_forever, name="maibot-dispatcher", daemon=True)
            self.thread.start()
        if settings.MAIBOT_CONSOLE_SERVICES:
            # In the background: arming the config watcher can take seconds, and due work must not
            # wait for it (the dispatcher is already running).
            self.services = threading.Thread(
                target=start_process_services, args=("cluster",), kwargs={"alive": self.alive}, daemon=True
            )
            self.services.start()

    def stop(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.stop()
            self.thread.join(timeout=30)
        if self.services is not None:
            # A stop before the services have started would leave them started after it.
            self.services.join()
        stop_process_services()
        heartbeat_release()
