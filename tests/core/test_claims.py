"""The claim machine (chat.claims), tested once against both of its users, the dispatcher's scheduled
messages and the outbox's outbound messages: a claim takes only pending rows and counts the attempt,
only the holder of a claim writes the row, concurrent claimers take disjoint rows, retry-or-fail by
the attempts left, expiry, and which claims are abandoned.

A dead process's claims die with it, in-process: the rule that takes claims back (the outbox sweep, the
dispatcher's recovery) on heartbeat rows the test writes — a dead claimer's rows at once, a live one's
never, however long it has held them —, two peers taking back and claiming the same rows at once, the
heartbeat's epochs, and a server paused while handing over that hands over nothing it may have lost.
The same with real processes: tests/maibot/test_cluster_faults.py (a server SIGKILLed behind HAProxy) and
tests/scheduling/test_claim_race.py (a cluster dying after its claim)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from chat import claims, outbox_rows
from chat.delivery_gate import DeliveryGate
from chat.models import AdapterPlatform, Message
from chat.outbox import Deliverer, Sink
from chat.outbox_rows import Delivery, outbox_claim, outbox_sweep
from chat.services import Outbound, messages_send
from core.config import get_config
from core.models import ProcessHeartbeat
from core.process import DEAD_AFTER_BEATS, Heartbeat, instance_id
from scheduling import dispatcher
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create
from tests.conftest import db, wait_for


def heartbeat_row(instance: str, *, alive_for: float) -> ProcessHeartbeat:
    """A process's heartbeat as the database has it: running out `alive_for` seconds from now."""
    now = timezone.now()
    return ProcessHeartbeat.objects.create(
        instance=instance,
        name=f"test:{instance}",
        role="web",
        started_at=now - timedelta(minutes=10),
        beat_at=now,
        alive_until=now + timedelta(seconds=alive_for),
    )


def outbound(session, text: str) -> Message:
    (message,) = messages_send([Outbound(session=session, source_kind="proactive", text=text)])
    return message


def claim_as(claimer: str, platform: str, **kwargs) -> list[int]:
    _, batch = outbox_claim(
        adapter_platforms=[platform], web_users=[], accept_formats={}, claimer=claimer, lease_seconds=3600, **kwargs
    )
    return [d.message_id for d in batch]


def fate(message: Message) -> tuple[str, str, str | None]:
    row = Message.objects.get(pk=message.pk)
    return row.delivery_status, row.delivery_error, row.delivery_claimed_by


def test_the_sweep_takes_back_a_dead_servers_claims_at_once_and_never_a_live_ones(make_session):
    AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now())  # echoes deliveries
    heartbeat_row("dead", alive_for=-0.5)
    heartbeat_row("slow", alive_for=30)
    echoing, quiet = make_session(platform="qq"), make_session(platform="tg")
    claimed = {}
    for owner in ("dead", "slow", "unknown"):
        for session in (echoing, quiet):
            message = outbound(session, f"{owner} {session.platform}")
            # Claimed ten minutes ago with an hour's lease: only the claimer's heartbeat can free it.
            assert claim_as(owner, session.platform, now=timezone.now() - timedelta(minutes=10)) == [message.pk]
            claimed[owner, session.platform] = message

    outbox_sweep()

    # The dead server's rows, at once: handed over again where the adapter echoes, failed where it
    # does not (it may have reached the platform: never twice).
    assert fate(claimed["dead", "qq"])[:2] == ("pending", "")
    # Perhaps handed over before the death: an echo that still comes for it counts.
    assert Message.objects.get(pk=claimed["dead", "qq"].pk).sent_at is not None
    assert fate(claimed["dead", "tg"])[:2] == ("failed", "delivery_interrupted")
    # A live server keeps its claim however long it has held it; a claimer with no heartbeat row (one
    # that never beat) is left to its lease.
    for owner in ("slow", "unknown"):
        for platform in ("qq", "tg"):
            assert fate(claimed[owner, platform]) == ("sending", "", owner)
    assert claim_as("peer", "qq") == [claimed["dead", "qq"].pk]
    assert Message.objects.get(pk=claimed["dead", "qq"].pk).delivery_attempts == 2


def due_tasks(make_session, n: int) -> list[str]:
    ids = [
        scheduled_message_create(
            session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text=f"m{i}", acted_by=SYSTEM
        ).task.pk
        for i in range(n)
    ]
    ScheduledMessage.objects.filter(pk__in=ids).update(due_at=timezone.now(), send_at=timezone.now())
    return ids


def test_the_dispatcher_takes_back_a_dead_clusters_claims_at_once_and_never_a_live_ones(make_session):
    heartbeat_row("dead", alive_for=-0.5)
    heartbeat_row("slow", alive_for=30)
    owned = {}
    for owner in ("dead", "slow", "unknown"):
        (task,) = due_tasks(make_session, 1)
        _, claimed = dispatcher.claim_due(timezone.now(), limit=10, lease_seconds=3600, claimer=owner)
        assert [c.pk for c in claimed] == [task]
        owned[owner] = task

    report = dispatcher.deliver_due()

    assert (report.recovered, report.sent) == (1, 1)
    states = dict(ScheduledMessage.objects.values_list("pk", "status"))
    assert states == {owned["dead"]: "sent", owned["slow"]: "sending", owned["unknown"]: "sending"}
    assert ScheduledMessage.objects.get(pk=owned["dead"]).claimed_by == instance_id()


def race(*peers) -> list:
    """Run the peers in threads released together; their results in order."""
    barrier = threading.Barrier(len(peers))
    results: list = [None] * len(peers)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = peers[i]()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(peers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)
def test_two_servers_taking_back_a_dead_servers_claims_at_once_take_each_row_once(make_session):
    AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now())
    sessions = [make_session(platform="qq") for _ in range(10)]
    messages = messages_send(
        [Outbound(session=sessions[i % 10], source_kind="proactive", text=f"m{i}") for i in range(200)]
    )
    heartbeat_row("dead", alive_for=30)
    assert len(claim_as("dead", "qq")) == 200
    ProcessHeartbeat.objects.filter(instance="dead").update(alive_until=timezone.now() - timedelta(seconds=1))

    def peer(name: str):
        return lambda: (outbox_sweep(), claim_as(name, "qq"))[1]

    first, second = race(peer("peer1"), peer("peer2"))

    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(m.pk for m in messages)
    # One hand-over by the dead server, one by whichever peer took the row: never two takers.
    assert set(Message.objects.values_list("delivery_attempts", flat=True)) == {2}


@pytest.mark.django_db(transaction=True)
def test_two_clusters_taking_back_a_dead_clusters_claims_at_once_send_each_once(make_session):
    ids = due_tasks(make_session, 100)
    heartbeat_row("dead", alive_for=30)
    _, claimed = dispatcher.claim_due(timezone.now(), limit=1000, lease_seconds=3600, claimer="dead")
    assert len(claimed) == 100
    ProcessHeartbeat.objects.filter(instance="dead").update(alive_until=timezone.now() - timedelta(seconds=1))

    first, second = race(dispatcher.deliver_due, dispatcher.deliver_due)

    assert first.recovered + second.recovered == 100
    assert first.sent + second.sent == 100
    assert ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count() == 100
    sent_for = list(Message.objects.values_list("extra__scheduled_message_id", flat=True))
    assert sorted(sent_for) == sorted(ids)


def test_a_heartbeat_of_the_previous_version_counts_neither_way(db):
    """During a rolling upgrade a process of the previous version writes its heartbeat by name alone: it
    makes no claim that names it, and it is never counted dead."""
    now = timezone.now()
    for name in ("old:1", "old:2"):
        ProcessHeartbeat.objects.update_or_create(
            name=name, defaults={"role": "cluster", "started_at": now, "beat_at": now - timedelta(hours=1)}
        )
    assert ProcessHeartbeat.objects.filter(instance__isnull=True).count() == 2
    assert not claims.dead_claimers().exists()


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_beat_that_comes_too_late_starts_an_epoch_earlier_claims_do_not_survive(db):
    interval = get_config().console.heartbeat_seconds
    clock = Monotonic()
    heartbeat = Heartbeat("web", instance="epochs", monotonic=clock)
    assert heartbeat.vouch() is None  # no beat yet: no claim

    heartbeat.beat()
    epoch = heartbeat.vouch()
    assert epoch is not None and heartbeat.vouches(epoch)
    row = ProcessHeartbeat.objects.get(instance="epochs")
    assert row.alive_until - row.beat_at == timedelta(seconds=interval * DEAD_AFTER_BEATS)

    clock.now += interval  # beats on time keep the epoch
    heartbeat.beat()
    assert heartbeat.vouches(epoch)

    # Paused (SIGSTOP, a stalled database write) for one interval less than the others wait: this
    # process stops vouching before anyone may count it dead.
    clock.now += interval * (DEAD_AFTER_BEATS - 1)
    assert not heartbeat.vouches(epoch) and heartbeat.vouch() is None
    heartbeat.beat()  # it comes back and beats: a new epoch, and the old claims stay lost
    assert not heartbeat.vouches(epoch)
    again = heartbeat.vouch()
    assert again is not None and again != epoch and heartbeat.vouches(again)


@dataclass
class ProvenConnection:
    """An adapter connection of a platform that echoes, proven already: the gate lets everything due through."""

    platform: str
    ready: bool = True
    opened_at: object = None
    proven: bool = True
    probe_id: int | None = None


def open_gate(platform: str) -> DeliveryGate:
    gate = DeliveryGate({platform: ProvenConnection(platform)})
    gate.echoing.add(platform)
    return gate


@dataclass
class RecordingSink(Sink):
    """One echoing platform connected here; `after_each` runs after each hand-over."""

    platform: str
    handed: list[int] = field(default_factory=list)
    after_each: object = None

    def web_users(self):
        return []

    def accept_formats(self):
        return {}

    async def deliver(self, delivery: Delivery) -> bool:
        self.handed.append(delivery.message_id)
        if self.after_each is not None:
            await self.after_each(delivery)
        return True


@pytest.mark.django_db(transaction=True)
async def test_a_server_paused_while_handing_over_hands_over_nothing_it_may_have_lost(make_session):
    def setup():
        AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now())
        session = make_session(platform="qq")
        return [outbound(session, f"m{i}").pk for i in range(4)]

    ids = await db(setup)
    clock = Monotonic()
    heartbeat = Heartbeat("web", monotonic=clock)  # this process's instance, as its claims name it
    await db(heartbeat.beat)
    taken_by_peer: list[int] = []

    async def pause_after_the_first(delivery: Delivery) -> None:
        if delivery.message_id != ids[0]:
            return
        # SIGSTOP here, for longer than the others wait: they count this server dead and one of them
        # takes its claim back and claims the rows itself.
        clock.now += 60

        def peer():
            ProcessHeartbeat.objects.filter(instance=heartbeat.instance).update(alive_until=timezone.now())
            outbox_sweep()
            taken_by_peer.extend(claim_as("peer", "qq"))

        await db(peer)

    sink = RecordingSink("qq", after_each=pause_after_the_first)
    deliverer = Deliverer(sink, open_gate("qq"))
    deliverer._loop = asyncio.get_running_loop()
    deliverer.heartbeat = heartbeat
    try:
        await deliverer._round()
    finally:
        deliverer.executor.shutdown(wait=True)

    # The first row went out before the pause (the receipt trade-off: its echo decides); none of the
    # rest went out once the process resumed.
    assert sink.handed == [ids[0]]
    assert sorted(taken_by_peer) == ids

    def rows():
        return list(Message.objects.order_by("id").values_list("delivery_status", "delivery_claimed_by"))

    # The resumed server's marks matched nothing: the peer's claim stands.
    assert await db(rows) == [("sending", "peer")] * 4


# --- the machine's invariants, against both users -------------------------------------------------


@dataclass
class ClaimUser:
    """One model run on the claim machine, with a way to make due pending rows of it."""

    spec: claims.ClaimSpec
    make: object  # (make_session, n) -> primary keys of n due pending rows
    age: str  # the field expiry counts from
    failed: dict  # a state out of the machine: failed, with its error

    def fail(self, error: str) -> dict:
        return {self.spec.status: "failed", **{k: error for k in self.failed}}


def outbound_rows(make_session, n: int) -> list[int]:
    session = make_session(platform="tg")
    return [outbound(session, f"m{i}").pk for i in range(n)]


USERS = {
    "dispatcher": ClaimUser(dispatcher.CLAIMS, due_tasks, "due_at", {"last_error": ""}),
    "outbox": ClaimUser(outbox_rows.CLAIMS, outbound_rows, "created_at", {"delivery_error": ""}),
}


@pytest.fixture(params=sorted(USERS))
def user(request) -> ClaimUser:
    return USERS[request.param]


def pending(spec: claims.ClaimSpec):
    def pick():
        rows = spec.model.objects.filter(**{spec.status: spec.pending}).order_by("pk")
        return list(rows.values_list("pk", flat=True))

    return pick


def row_of(spec: claims.ClaimSpec, pk) -> dict:
    fields = (spec.status, spec.token, spec.claimer, spec.lease, spec.attempts)
    return spec.model.objects.filter(pk=pk).values(*fields).get()


def test_a_claim_takes_only_pending_rows_stamps_them_and_counts_the_attempt(user, make_session):
    spec = user.spec
    ids = user.make(make_session, 3)
    now = timezone.now()

    token, taken = claims.claim(spec, pending(spec), now=now, lease_seconds=60, claimer="one")

    assert taken == 3
    assert sorted(claims.held(spec, token).values_list("pk", flat=True)) == sorted(ids)
    row = row_of(spec, ids[0])
    assert (row[spec.status], row[spec.token], row[spec.claimer]) == (spec.sending, token, "one")
    assert row[spec.lease] == now + timedelta(seconds=60) and row[spec.attempts] == 1
    # Claimed rows are no candidates: a second claimer, by query or by key, takes nothing.
    assert claims.claim(spec, pending(spec), now=now, lease_seconds=60, claimer="two")[1] == 0
    assert claims.claim(spec, ids, now=now, lease_seconds=60, claimer="two")[1] == 0


def test_only_the_holder_of_a_claim_writes_the_row(user, make_session):
    spec = user.spec
    (pk,) = user.make(make_session, 1)
    heartbeat_row("paused", alive_for=-1)
    lost, _ = claims.claim(spec, [pk], now=timezone.now(), lease_seconds=3600, claimer="paused")
    # Its claimer counted dead: taken back, then claimed by a peer.
    assert claims.end(spec, claims.abandoned(spec, timezone.now()), **{spec.status: spec.pending}) == 1
    mine, _ = claims.claim(spec, [pk], now=timezone.now(), lease_seconds=3600, claimer="peer")

    # The resumed claimer's finish matches nothing; the holder's ends the claim.
    assert claims.finish(spec, lost, [pk], **{spec.status: spec.pending}) == 0
    assert row_of(spec, pk)[spec.claimer] == "peer"
    assert claims.finish(spec, mine, [pk], **{spec.status: spec.pending}) == 1
    row = row_of(spec, pk)
    assert (row[spec.status], row[spec.token], row[spec.lease], row[spec.attempts]) == (spec.pending, "", None, 2)


def test_abandoned_claims_are_a_dead_claimers_and_lapsed_leases_never_a_live_ones(user, make_session):
    spec = user.spec
    heartbeat_row("dead", alive_for=-0.5)
    heartbeat_row("live", alive_for=30)
    now = timezone.now()
    owned = {}
    for owner, lease in (("dead", 3600), ("live", 3600), ("live-lapsed", -1), ("unknown", 3600)):
        (pk,) = user.make(make_session, 1)
        claimer = owner.split("-")[0]
        assert claims.claim(spec, [pk], now=now, lease_seconds=lease, claimer=claimer)[1] == 1
        owned[owner] = pk

    assert sorted(claims.abandoned(spec, now).values_list("pk", flat=True)) == sorted(
        [owned["dead"], owned["live-lapsed"]]
    )


def test_a_failed_attempt_is_retried_while_attempts_are_left_then_fails_for_good(user, make_session):
    spec = user.spec
    ids = user.make(make_session, 3)
    token, _ = claims.claim(spec, ids, now=timezone.now(), lease_seconds=60)
    spec.model.objects.filter(pk=ids[0]).update(**{spec.attempts: 5})

    retried, failed = claims.retry_or_fail(
        claims.held(spec, token),
        attempts=spec.attempts,
        most=5,
        retry={**spec.released(), spec.status: spec.pending},
        fail={**spec.released(), **user.fail("no_echo")},
    )

    assert (retried, failed) == (2, 1)
    assert row_of(spec, ids[0])[spec.status] == "failed"
    assert {row_of(spec, pk)[spec.status] for pk in ids[1:]} == {spec.pending}
    assert not claims.held(spec, token).exists()


def test_expiry_fails_only_pending_rows_past_their_age(user, make_session):
    spec = user.spec
    old, claimed, young = user.make(make_session, 3)
    spec.model.objects.filter(pk__in=[old, claimed]).update(**{user.age: timezone.now() - timedelta(days=2)})
    claims.claim(spec, [claimed], now=timezone.now(), lease_seconds=60)

    assert claims.expire(spec, age=user.age, before=timezone.now() - timedelta(days=1), **user.fail("expired")) == 1
    assert [row_of(spec, pk)[spec.status] for pk in (old, claimed, young)] == ["failed", spec.sending, spec.pending]


@pytest.mark.django_db(transaction=True)
def test_claimers_at_once_take_disjoint_rows_and_between_them_all(user, make_session):
    spec = user.spec
    ids = user.make(make_session, 60)

    def claimer(name: str):
        def run():
            token, _ = claims.claim(spec, pending(spec), now=timezone.now(), lease_seconds=60, claimer=name)
            return list(claims.held(spec, token).values_list("pk", flat=True))

        return run

    first, second, third = race(claimer("a"), claimer("b"), claimer("c"))

    assert not (set(first) & set(second)) and not (set(first) & set(third)) and not (set(second) & set(third))
    assert sorted(first + second + third) == sorted(ids)
    assert set(spec.model.objects.values_list(spec.attempts, flat=True)) == {1}


@pytest.mark.django_db(transaction=True)
def test_every_update_of_the_machine_locks_its_rows_in_primary_key_order(make_session):
    """On PostgreSQL each of the machine's UPDATEs takes its row locks in primary-key order, so two of them
    over the same rows (two releasers, a releaser and a claimer: the race above, which deadlocked once in
    CI when each locked in its own scan's order) wait for one another instead."""
    if not connection.features.has_select_for_update:
        pytest.skip("SQLite writes one transaction at a time: no row locks to order")
    from django.test.utils import CaptureQueriesContext

    AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now())
    session = make_session(platform="qq")
    messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(3)])
    heartbeat_row("dead", alive_for=30)
    with CaptureQueriesContext(connection) as queries:
        assert len(claim_as("dead", "qq")) == 3
        ProcessHeartbeat.objects.filter(instance="dead").update(alive_until=timezone.now() - timedelta(seconds=1))
        outbox_sweep()  # the dead claimer's rows: retry_or_fail
        token, taken = claims.claim(
            outbox_rows.CLAIMS, list(Message.objects.values_list("pk", flat=True)), now=timezone.now(), lease_seconds=60
        )
        assert taken == 3
        assert claims.finish(outbox_rows.CLAIMS, token, list(Message.objects.values_list("pk", flat=True))) == 3
        claims.expire(outbox_rows.CLAIMS, age="created_at", before=timezone.now())
    # The machine's writes: each sets the claim token (a claim stamps it, every end clears it), but the
    # expiry of pending rows, which is last.
    machine = [q["sql"] for q in queries.captured_queries if '"delivery_claim" =' in q["sql"].split("WHERE")[0]]
    machine.append([q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")][-1])
    assert len(machine) >= 5, machine  # the two claims, the take-back, the finish, the expiry
    for sql in machine:
        assert sql.startswith('UPDATE "chat_message"') and "ORDER BY" in sql and "FOR UPDATE OF" in sql, sql


@pytest.mark.django_db(transaction=True)
def test_an_update_postgresql_aborts_to_break_a_deadlock_is_run_again(make_session):
    """Whatever order the machine locks in, another transaction can make a cycle of waits: here one that
    holds the second of two rows and then asks for the first, which the machine's UPDATE holds while it
    waits for the second. PostgreSQL aborts one of the two (this UPDATE: its deadlock_timeout is the
    shorter); the UPDATE runs again, once the other has finished, and takes both rows."""
    if not connection.features.has_select_for_update:
        pytest.skip("SQLite writes one transaction at a time: no row locks, no deadlock")
    from django.db import connections

    session = make_session(platform="qq")
    messages_send([Outbound(session=session, source_kind="proactive", text=f"m{i}") for i in range(2)])
    first, second = Message.objects.order_by("pk").values_list("pk", flat=True)
    connection.ensure_connection()
    ours = connection.connection.info.backend_pid
    holds_second, other_done = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def other() -> None:
        try:
            from django.db import transaction

            with transaction.atomic():
                with connections["default"].cursor() as cursor:
                    cursor.execute("SET LOCAL deadlock_timeout = '60s'")  # never the one aborted
                list(Message.objects.filter(pk=second).select_for_update())
                holds_second.set()

                def ours_waits() -> bool:
                    with connections["default"].cursor() as cursor:
                        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [ours])
                        return cursor.fetchone()[0] == "Lock"

                assert wait_for(ours_waits, timeout=20, interval=0.01), "the machine's UPDATE never waited"
                list(Message.objects.filter(pk=first).select_for_update())  # the cycle: ours holds the first
        except BaseException as exc:
            failure.append(exc)
        finally:
            connections["default"].close()
            other_done.set()

    thread = threading.Thread(target=other)
    thread.start()
    assert holds_second.wait(20)
    with connection.cursor() as cursor:
        cursor.execute("SET deadlock_timeout = '100ms'")
    try:
        expired = claims.expire(
            outbox_rows.CLAIMS, age="created_at", before=timezone.now() + timedelta(seconds=5), delivery_error="x"
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET deadlock_timeout")
        thread.join(30)
    assert not failure, failure
    assert expired == 2  # both rows, after the other transaction ended
