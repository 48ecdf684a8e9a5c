"""The outbox deliverer never polls: with its safety polls at ten minutes it still hands a row over the
moment its redelivery backoff ends, takes back a stuck server's claim when its lease runs out, and a dead
server's as soon as its heartbeat has (the beats of this process tell it: core.process.on_peer_death).
The project's ASGI app with a 0.6.x adapter socket (Channels' WebsocketCommunicator)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from chat.models import AdapterPlatform, Message
from chat.outbox_rows import outbox_claim
from chat.services import Outbound, messages_send
from core.config import override
from core.models import ProcessHeartbeat
from tests.chat.gateway_helpers import TIMEOUT, adapter
from tests.conftest import db

pytestmark = pytest.mark.django_db(transaction=True)

LONG = 600.0  # every safety poll, far longer than the test
SAFETY = {"outbox_poll_seconds": LONG, "outbox_poll_seconds_with_redis": LONG, "outbox_sweep_seconds": LONG}


@pytest.fixture
def long_polls():
    with override(gateway={**SAFETY, "confirm_seconds": LONG, "delivery_lease_seconds": LONG}) as cfg:
        yield cfg


def _send_one(make_session, **update) -> Message:
    """One outbound row on an echoing platform, changed by `update` in the same transaction (so the
    wake-up of its send finds it already changed)."""
    AdapterPlatform.objects.create(platform="qq", first_echo_at=timezone.now(), last_echo_at=timezone.now())
    with transaction.atomic():
        (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="准时 on time")])
        Message.objects.filter(pk=message.pk).update(**update)
    return message


async def test_a_row_is_handed_over_when_its_redelivery_backoff_ends_without_a_poll(app, make_session, long_polls):
    due = timezone.now() + timedelta(seconds=2)
    message = await db(_send_one, make_session, next_attempt_at=due)
    comm = adapter(app)
    assert (await comm.connect(timeout=TIMEOUT))[0]
    try:
        frame = await comm.receive_json_from(timeout=TIMEOUT)
        arrived = timezone.now()
    finally:
        await comm.disconnect()
    assert frame["message_info"]["message_id"] == str(message.uid)
    assert 0 <= (arrived - due).total_seconds() < 1.0, arrived - due


def _claimed_by(make_session, claimer: str, *, alive_for: float, lease: float) -> Message:
    now = timezone.now()
    ProcessHeartbeat.objects.create(
        instance=claimer,
        name=f"elsewhere:{claimer}",
        role="web",
        started_at=now,
        beat_at=now,
        alive_until=now + timedelta(seconds=alive_for),
    )
    AdapterPlatform.objects.create(platform="qq", first_echo_at=now, last_echo_at=now)
    with transaction.atomic():
        (message,) = messages_send([Outbound(session=make_session(), source_kind="proactive", text="taken back")])
        _, batch = outbox_claim(
            adapter_platforms=["qq"], web_users=[], accept_formats={}, lease_seconds=lease, claimer=claimer
        )
    assert [d.message_id for d in batch] == [message.pk]
    return message


async def _handed_over_to_a_new_adapter(app, message: Message) -> float:
    """Connect an adapter; the seconds until the row claimed elsewhere reaches it."""
    comm = adapter(app)
    assert (await comm.connect(timeout=TIMEOUT))[0]
    try:
        frame = await comm.receive_json_from(timeout=30)
        at = time.monotonic()
    finally:
        await comm.disconnect()
    assert frame["message_info"]["message_id"] == str(message.uid)
    return at


async def test_a_stuck_servers_claim_is_taken_back_when_its_lease_runs_out_without_a_poll(
    app, make_session, long_polls
):
    lease = 3.0
    claimed = time.monotonic()  # before the claim: the lease runs from a moment later
    message = await db(_claimed_by, make_session, "stuck-server", alive_for=LONG, lease=lease)
    at = await _handed_over_to_a_new_adapter(app, message)
    assert lease <= at - claimed < lease + 1.5, at - claimed


async def test_a_dead_servers_claim_is_taken_back_when_its_heartbeat_runs_out_without_a_poll(
    app, make_session, long_polls
):
    from core.config import get_config

    alive_for = 2.0
    claimed = time.monotonic()
    message = await db(_claimed_by, make_session, "dead-server", alive_for=alive_for, lease=LONG)
    at = await _handed_over_to_a_new_adapter(app, message)
    # Noticed at the first beat of this process after the dead server's heartbeat ran out.
    beat = get_config().console.heartbeat_seconds
    assert alive_for <= at - claimed < alive_for + beat + 1.5, at - claimed
    assert await db(lambda: Message.objects.get(pk=message.pk).delivery_claimed_by) != "dead-server"
