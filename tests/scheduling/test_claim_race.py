"""Several processes race for the same due rows: every message is sent exactly once, and a process
that dies after claiming loses nothing. Runs on SQLite and, with DATABASE_URL, on PostgreSQL."""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from chat.models import Message, SourceKind
from scheduling import dispatcher
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create
from tests.conftest import subprocess_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]
WORKER = Path(__file__).with_name("claim_worker.py")


def make_due_tasks(make_session, n: int) -> list[str]:
    ids = [
        scheduled_message_create(
            session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text=f"m{i}", acted_by=SYSTEM
        ).task.pk
        for i in range(n)
    ]
    ScheduledMessage.objects.filter(pk__in=ids).update(due_at=timezone.now(), send_at=timezone.now())
    return ids


def run_workers(
    args: list[str], n: int, tmp_path: Path, *, together: bool = False
) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            env=subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / f"w{i}")),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    if together:
        # A start barrier: every worker says "ready" (Django set up), then all are told "go" at once.
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_four_processes_racing_send_every_message_exactly_once(make_session, tmp_path):
    ids = make_due_tasks(make_session, 400)
    results = run_workers(["deliver", "7"], 4, tmp_path, together=True)  # small batches: many interleaved claims
    for r in results:
        assert r.returncode == 0, r.stderr
    per_worker = [int(r.stdout.split()[-1]) for r in results]
    assert sum(per_worker) == 400
    assert sum(1 for n in per_worker if n) >= 2, per_worker  # they really raced
    assert ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count() == 400
    sent_for = list(
        Message.objects.filter(source_kind=SourceKind.SCHEDULED_SEND).values_list(
            "extra__scheduled_message_id", flat=True
        )
    )
    assert sorted(sent_for) == sorted(ids)  # one outbound message per task, none twice


def test_a_process_dying_after_its_claim_loses_nothing_and_sends_nothing_twice(make_session, tmp_path, clock):
    ids = make_due_tasks(make_session, 30)
    [crashed] = run_workers(["claim-and-die"], 1, tmp_path)
    assert crashed.returncode == 17 and "claimed 30" in crashed.stdout
    held = ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENDING)
    assert held.count() == 30
    lease_until = held.first().lease_until
    clock.now = lease_until - timedelta(seconds=1)
    assert dispatcher.deliver_due(clock=clock).sent == 0  # still leased: nobody else may send them yet
    clock.now = lease_until + timedelta(seconds=1)  # the worker's 60 s lease has run out
    report = dispatcher.deliver_due(clock=clock)
    assert (report.recovered, report.sent) == (30, 30)
    assert dispatcher.deliver_due(clock=clock).claimed == 0
    assert ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count() == 30
    assert Message.objects.filter(source_kind=SourceKind.SCHEDULED_SEND).count() == 30
