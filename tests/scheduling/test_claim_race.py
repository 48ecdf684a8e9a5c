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


def _start(args: list[str], n: int, tmp_path: Path) -> list[subprocess.Popen]:
    return [
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


def run_workers(args: list[str], n: int, tmp_path: Path) -> list[subprocess.CompletedProcess]:
    procs = _start(args, n, tmp_path)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def race_in_rounds(n: int, batch: int, tmp_path: Path, *, rounds: int = 1000) -> list[list[int]]:
    """Run `n` delivering workers in lockstep until no work is left; each worker's claims per round."""
    procs = _start(["deliver", str(batch)], n, tmp_path)
    claims: list[list[int]] = [[] for _ in procs]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        unfinished = ScheduledMessage.objects.filter(status__in=[ScheduledStatus.PENDING, ScheduledStatus.SENDING])
        for round_no in range(rounds):
            # Who hears "go" first changes every round, so no worker is favoured by the order.
            for p in procs[round_no % n :] + procs[: round_no % n]:
                p.stdin.write("go\n")
                p.stdin.flush()
            for i, p in enumerate(procs):
                line = p.stdout.readline().split()
                assert line and line[0] == "round", p.stderr.read()
                claims[i].append(int(line[1]))
            if not unfinished.exists():
                break
        for p in procs:
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return claims


@pytest.mark.long
def test_four_processes_racing_send_every_message_exactly_once(make_session, tmp_path):
    ids = make_due_tasks(make_session, 400)
    claims = race_in_rounds(4, 7, tmp_path)  # small batches: many interleaved claims
    assert sum(map(sum, claims)) == 400
    # Every worker tried to claim in every round while work was left (lockstep), and the work was
    # really shared: more than one of them won claims.
    assert len({len(worker) for worker in claims}) == 1
    assert sum(1 for worker in claims if sum(worker)) >= 2, claims
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
