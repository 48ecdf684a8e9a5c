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
