"""The task cluster's shape (django-q2): workers forked only while there is work, and on the embedded default a
queue that is woken rather than polled.

django-q2's sentinel forks its `workers` at start and keeps them whatever the load; they idle for hours in
a small deployment (timers and summaries are rare). `OnDemandSentinel` forks a worker when the pusher has
queued a task and fewer than `workers` are there to take it (within one guard cycle, 0.5 s), and retires
the workers (a STOP each, as django-q2 stops them) once every one of them has been idle for
MAIBOT_Q_IDLE_WORKER_SECONDS (60) with nothing queued. A worker that died any other way (crash, timeout, recycling)
is handled as django-q2 handles it. The cluster command puts it in place of django-q2's Sentinel.

`WakeableORM` (Q_CLUSTER's `broker_class` on the embedded default) is django-q2's ORM broker whose pusher,
on an empty queue, waits on a local wake socket (chat.wake, directory `<wake dir>/tasks`) instead of
querying again every `poll` seconds; an enqueue wakes it once its transaction commits. The wait ends after
`POLL_SECONDS` anyway: a lost wake, or a task whose lock ran out (the ORM broker's `retry`), costs that
long, never the task. Stopping: the cluster command wakes the pusher while the sentinel stops.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django_q.brokers.orm import ORM
from django_q.cluster import Sentinel
from django_q.conf import Conf
from django_q.status import Stat

from chat.wake import WakeInbox, wake_dir, wake_local

logger = logging.getLogger(__name__)

POLL_SECONDS = 10.0
STOP = "STOP"  # django-q2's pill: a worker that takes it ends


def tasks_wake_dir() -> Path:
    return wake_dir() / "tasks"


def wake_task_queue() -> int:
    """Wake every pusher waiting on this database's queue; how many were reached. Never raises."""
    return wake_local(directory=tasks_wake_dir())


class WakeableORM(ORM):
    """The ORM broker, woken instead of polled (see the module). Needs Q_CLUSTER `poll` 0: the ORM
    broker's own sleep on an empty queue."""

    _inbox: WakeInbox | None = None

    def enqueue(self, task) -> int:
        pk = super().enqueue(task)
        transaction.on_commit(wake_task_queue, using=Conf.ORM)
        return pk

    def dequeue(self):
        tasks = super().dequeue()
        if not tasks:
            if self._inbox is None:
                self._inbox = WakeInbox(tasks_wake_dir())
            self._inbox.wait(POLL_SECONDS)
        return tasks


class OnDemandSentinel(Sentinel):
    """django-q2's sentinel with workers forked on demand (see the module)."""

    def spawn_cluster(self) -> None:
        # django-q2's start-up (stats, monitor, pusher) with no worker yet.
        size, self.pool_size = self.pool_size, 0
        try:
            super().spawn_cluster()
        finally:
            self.pool_size = size
        self.retiring = 0  # STOPs put for idle workers and not yet seen taken
        self.idle_since: float | None = None

    def guard(self) -> None:
        """Until stopped: tend the workers, bring back a dead monitor or pusher, save the status."""
        logger.info("%s guarding cluster %s [%s]", self.name, self.cluster_name, self.queue_name())
        self.start_event.set()
        Stat(self).save()
        logger.info("Q Cluster %s running (workers on demand, at most %d)", self.cluster_name, self.pool_size)
        while True:
            self.tend_workers(Conf.GUARD_CYCLE)
            if not self.monitor.is_alive():
                self.reincarnate(self.monitor)
            if not self.pusher.is_alive():
                self.reincarnate(self.pusher)
            Stat(self).save()
            if self.stop_event.wait(Conf.GUARD_CYCLE):
                break
        self.stop()

    @property
    def cluster_name(self) -> str:
        from django_q.humanhash import humanize

        return humanize(self.cluster_id.hex)

    def tend_workers(self, cycle: float) -> None:
        for process in list(self.pool):
            with process.timer.get_lock():
                if not process.is_alive() or process.timer.value == 0:
                    if self._retired(process):
                        self.pool.remove(process)
                    else:
                        self.reincarnate(process)  # crashed, timed out or recycled: as django-q2 does
                elif process.timer.value > 0:
                    process.timer.value -= cycle  # a busy worker's time left
        waiting = max(0, self.task_queue.qsize() - self.retiring)
        busy = sum(1 for p in self.pool if p.timer.value != -1)
        for _ in range(min(waiting - (len(self.pool) - self.retiring - busy), self.pool_size - len(self.pool))):
            self.spawn_worker()
        self._retire_idle(waiting, busy)

    def _retired(self, process) -> bool:
        """A worker that ended on one of the STOPs put for idle workers (idle, exit status 0)."""
        if self.retiring and process.exitcode == 0 and process.timer.value == -1:
            self.retiring -= 1
            return True
        return False

    def _retire_idle(self, waiting: int, busy: int) -> None:
        idle = len(self.pool) - self.retiring
        if waiting or busy or not idle:
            self.idle_since = None
            return
        now = time.monotonic()
        if self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since >= settings.MAIBOT_Q_IDLE_WORKER_SECONDS:
            for _ in range(idle):
                self.task_queue.put(STOP)
            self.retiring += idle
            self.idle_since = None
            logger.info("%d idle workers retired (forked again when tasks come)", idle)
