"""A real `manage.py qcluster` process delivers scheduled messages on time; its workers are forked for tasks
and retired when idle, and its queue is woken rather than polled."""

import ctypes
import os
import platform
import signal
import sys
import time
from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

from scheduling import taskqueue
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create
from scheduling.wakeups import dispatchers_wake
from tests.conftest import Proc, descendants, subprocess_env
from tests.conftest import wait_for as shared_wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]


wait_for = partial(shared_wait_for, timeout=15.0)
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def test_qcluster_delivers_a_task_due_in_two_seconds_on_time(make_session, shared_qcluster):
    session = make_session()
    task = scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(seconds=2), message_text="准时 on time", acted_by=SYSTEM
    ).task
    assert wait_for(lambda: ScheduledMessage.objects.get(pk=task.pk).status == ScheduledStatus.SENT)
    task.refresh_from_db()
    assert task.sent_message.text == "准时 on time"
    assert 0 <= task.lateness_seconds < 1.0, task.lateness_seconds


def test_a_message_written_in_another_process_wakes_the_cluster_and_is_sent_on_time(
    make_session, start_qcluster, tmp_path
):
    """The cluster's safety poll is ten minutes: only the wake-up from this process (the local wake
    socket, or the channel layer with REDIS_URL) gets the message out, at its due instant."""
    data = tmp_path / "data-slow-poll"
    data.mkdir()
    (data / "bot_config.toml").write_text("[scheduling]\npoll_interval = 600.0\n", encoding="utf-8")
    proc = start_qcluster("slow-poll")
    # Its wake-up endpoint is open before its first look for work: a wake-up sent from now on is never missed.
    assert "woken locally" in proc.output() or "woken via Redis" in proc.output(), proc.output()
    task = scheduled_message_create(
        session=make_session(),
        send_at=timezone.now() + timedelta(seconds=2),
        message_text="唤醒 woken",
        acted_by=SYSTEM,
    ).task
    assert wait_for(lambda: ScheduledMessage.objects.get(pk=task.pk).status == ScheduledStatus.SENT), proc.output()
    task.refresh_from_db()
    assert 0 <= task.lateness_seconds < 1.0, task.lateness_seconds


def test_two_clusters_send_every_task_exactly_once(make_session, start_qcluster):
    start_qcluster("a")
    start_qcluster("b")
    later = timezone.now() + timedelta(hours=1)
    ids = [
        scheduled_message_create(session=make_session(), send_at=later, message_text=f"m{i}", acted_by=SYSTEM).task.pk
        for i in range(200)
    ]
    # All due together, 2 s from now (creating them may take a while on a loaded machine).
    when = timezone.now() + timedelta(seconds=2)
    ScheduledMessage.objects.filter(pk__in=ids).update(send_at=when, due_at=when)
    dispatchers_wake()  # a raw UPDATE wakes no one (the services do): as a service would
    assert wait_for(
        lambda: ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count() == 200, timeout=30
    )
    from chat.models import Message

    assert Message.objects.filter(source_kind="scheduled_send").count() == 200
    assert len(set(Message.objects.values_list("extra__scheduled_message_id", flat=True))) == 200


def test_qcluster_stops_cleanly_on_sigterm(start_qcluster):
    proc = start_qcluster()
    code = proc.stop()
    assert code == 0, proc.output()
    assert "dispatcher stopped" in proc.output()


def test_qcluster_stops_when_the_signal_lands_on_another_thread(start_qcluster):
    """The kernel hands a process's SIGTERM to any of its threads; aimed here (tgkill) at a thread other
    than the main one, it still stops the cluster (a main thread blocked joining the sentinel never ran
    the handler, and the cluster lived on)."""
    proc = start_qcluster()
    assert wait_for(lambda: "console services started" in proc.output())
    pid = proc.popen.pid
    others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    assert others, "no thread beside the main one"
    tgkill = ctypes.CDLL(None, use_errno=True).syscall
    for tid in others:
        if tgkill(SYS_TGKILL[platform.machine()], pid, tid, signal.SIGTERM) == 0:
            break
    else:
        pytest.fail("no thread took the signal")
    proc.popen.wait(timeout=30)
    assert proc.popen.returncode == 0, proc.output()
    assert "dispatcher stopped" in proc.output()


@pytest.mark.parametrize("line", ["Q Cluster", "pushing tasks", "guarding cluster"])
def test_qcluster_stops_on_a_signal_in_the_middle_of_starting(tmp_path, transactional_db, line):
    """A stop while the cluster is still starting (the supervisor stopping at once, a quick Ctrl-C)
    ends it as cleanly: django-q2's own handler could deadlock the start here, joining the sentinel
    from inside the wait for its start."""
    (tmp_path / "data").mkdir()
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"), MAIBOT_Q_NAME=f"test-{os.getpid()}")
    proc = Proc([sys.executable, "manage.py", "qcluster"], env, tmp_path / "q.log")
    proc.wait_for_output(line, timeout=60)
    assert proc.stop() == 0, proc.output()
    assert "has stopped" in proc.output()


def test_overdue_tasks_are_sent_when_the_cluster_starts_and_stale_ones_expire(make_session, start_qcluster):
    session = make_session()
    overdue = scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(hours=1), message_text="late but sent", acted_by=SYSTEM
    ).task
    stale = scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(hours=1), message_text="too old", acted_by=SYSTEM
    ).task
    # The cluster was down: one is ten minutes overdue, the other two days (past the 1-day expiry).
    ScheduledMessage.objects.filter(pk=overdue.pk).update(
        send_at=timezone.now() - timedelta(minutes=10), due_at=timezone.now() - timedelta(minutes=10)
    )
    ScheduledMessage.objects.filter(pk=stale.pk).update(
        send_at=timezone.now() - timedelta(days=2), due_at=timezone.now() - timedelta(days=2)
    )
    start_qcluster()
    assert wait_for(lambda: ScheduledMessage.objects.get(pk=overdue.pk).status == ScheduledStatus.SENT)
    overdue.refresh_from_db()
    assert 600 <= overdue.lateness_seconds < 700
    stale.refresh_from_db()
    assert (stale.status, stale.last_error) == (ScheduledStatus.FAILED, "expired")
    assert stale.sent_message is None


def _run_task(name: str) -> float:
    """Enqueue math.floor(2.5) as a django-q2 task; seconds from the enqueue until a worker had run it."""
    from django_q.models import Success
    from django_q.tasks import async_task

    async_task("math.floor", 2.5, task_name=name, cluster=f"test-{os.getpid()}")
    assert wait_for(lambda: Success.objects.filter(name=name).exists()), f"task {name} never ran"
    done = Success.objects.get(name=name)
    assert done.result == 2
    return (done.stopped - done.started).total_seconds()


def test_workers_are_forked_for_tasks_and_retired_when_idle_and_the_queue_is_woken_not_polled(
    start_qcluster, monkeypatch
):
    from django_q.conf import Conf

    # Tasks for the test's cluster (launch_qcluster names it after this process): on its queue, signed
    # with its name.
    monkeypatch.setattr(Conf, "PREFIX", f"test-{os.getpid()}")
    proc = start_qcluster(MAIBOT_Q_IDLE_WORKER_SECONDS="2")
    # At rest: the sentinel, its monitor and its pusher; no worker.
    assert wait_for(lambda: len(descendants(proc.popen.pid)) == 3), descendants(proc.popen.pid)

    took = _run_task("on-demand-1")
    # Woken by the enqueue: well within the pusher's 10 s safety poll (a fork and a guard cycle).
    assert took < taskqueue.POLL_SECONDS / 2, took
    assert wait_for(lambda: "idle workers retired" in proc.output()), proc.output()
    assert wait_for(lambda: len(descendants(proc.popen.pid)) == 3), descendants(proc.popen.pid)

    assert _run_task("on-demand-2") < taskqueue.POLL_SECONDS / 2  # forked again
    stopping = time.monotonic()
    assert proc.stop() == 0, proc.output()
    # The pusher waiting on the empty queue is woken to stop, not left to its safety poll.
    assert time.monotonic() - stopping < taskqueue.POLL_SECONDS / 2
