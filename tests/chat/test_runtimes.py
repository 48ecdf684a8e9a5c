"""The session runtimes (chat.runtimes) on their own: given the group wake it sends through, it falls back to waking a
live runtime directly when the channel layer cannot carry the wake. Offline mode (the tests' default
config): every message gets an offline answer, one recorded cycle each."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from chat.models import PlannerCycle
from chat.runtimes import SessionRuntimes
from core import config
from tests.chat.planner_helpers import inbound_store
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


async def answered(session, n: int) -> None:
    async def check() -> bool:
        return await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount() >= n

    await wait_for_async(check, what=f"{n} offline answer(s) in session {session.pk}")


async def test_a_wake_the_channel_layer_cannot_carry_reaches_the_live_runtime_directly(make_session):
    tried = []

    async def layer_down(session_pk: int, reason: str) -> bool:
        tried.append((session_pk, reason))
        raise ConnectionError("the channel layer is down")

    registry = SessionRuntimes(wake=layer_down)
    session = await asyncio.to_thread(make_session)
    try:
        with config.override(chat={"debounce_seconds": 0.05}):
            first = await sync_to_async(inbound_store)(session=session, text="hello")
            assert registry.notify(session.pk, [first.pk])  # starts the runtime: no wake sent
            await answered(session, 1)
            runtime = registry.get(session.pk)
            second = await sync_to_async(inbound_store)(session=session, text="still there?")
            assert registry.notify(session.pk, [second.pk])
            await answered(session, 2)
        assert tried == [(session.pk, "message")]
        assert registry.get(session.pk) is runtime and runtime.last_seen_pk == second.pk
    finally:
        await registry.shutdown()
