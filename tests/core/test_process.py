"""The heartbeat /healthz reads: written while the process's vital parts run, withheld when one is down,
removed on a clean stop."""

from __future__ import annotations

import pytest

from core.models import ProcessHeartbeat
from core.process import Heartbeat
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db


def test_heartbeat_is_withheld_while_a_vital_part_is_down():
    alive = {"dispatcher": True}
    heartbeat = Heartbeat("cluster", alive=lambda: alive["dispatcher"])
    heartbeat.beat()
    first = ProcessHeartbeat.objects.get(name=heartbeat.name).beat_at

    alive["dispatcher"] = False
    heartbeat.beat()
    assert ProcessHeartbeat.objects.get(name=heartbeat.name).beat_at == first

    alive["dispatcher"] = True
    heartbeat.beat()
    assert ProcessHeartbeat.objects.get(name=heartbeat.name).beat_at > first


@pytest.mark.django_db(transaction=True)
def test_a_clean_stop_removes_the_heartbeat():
    heartbeat = Heartbeat("cluster").start()
    try:
        assert wait_for(lambda: ProcessHeartbeat.objects.filter(name=heartbeat.name).exists(), timeout=10)
    finally:
        heartbeat.stop()
    assert not ProcessHeartbeat.objects.filter(name=heartbeat.name).exists()


def test_a_beat_tells_the_peer_death_listeners_once_when_another_process_dies():
    """The dispatcher and the outbox wait for wake-ups; a dead process wakes no one, so the beats of the
    living tell them (core.process.on_peer_death), once per death."""
    from datetime import timedelta

    from django.utils import timezone

    from core.process import on_peer_death

    deaths = []
    forget = on_peer_death(lambda: deaths.append(1))
    try:
        heartbeat = Heartbeat("cluster")
        heartbeat.beat()
        assert deaths == []  # nobody is dead
        now = timezone.now()
        peer = Heartbeat("web", instance="peer")
        peer.beat()
        heartbeat.beat()
        assert deaths == []  # alive
        ProcessHeartbeat.objects.filter(instance="peer").update(alive_until=now - timedelta(seconds=1))
        heartbeat.beat()
        assert deaths == [1]
        heartbeat.beat()
        assert deaths == [1]  # the same death is told once
    finally:
        forget()
    heartbeat.beat()
    ProcessHeartbeat.objects.create(
        instance="another", name="x", role="web", started_at=now, beat_at=now, alive_until=now - timedelta(seconds=1)
    )
    heartbeat.beat()
    assert deaths == [1]  # a listener forgotten hears nothing
