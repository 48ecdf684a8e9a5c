"""Session runtimes as Channels consumers: woken by channel-layer group messages from outside the
runtime (this process, a worker thread, or — with Redis — another layer instance standing in for the
cluster), coalescing wakes without losing a message."""

import asyncio
import os

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

from chat.models import PlannerCycle
from chat.runtime import session_group, wake_session, wake_session_from_sync_process, wake_session_soon
from tests.chat.planner_helpers import fake_llm_fixture, inbound_store, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)

needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="REDIS_URL is not set")


@pytest.fixture
def private(make_session):
    return make_session(user_nickname="Alice")


async def finished_cycles(session, n):
    async def check():
        return await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount() >= n

    await wait_for_async(check, what=f"{n} finished cycle(s)")
    return [c async for c in PlannerCycle.objects.filter(session=session).order_by("started_at")]


async def live_runtime(runtimes, session, fake_llm):
    """A runtime started the ordinary way (an inbound message), its first cycle done."""
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "ok"})
    await say(session, "hello")
    await finished_cycles(session, 1)
    runtime = runtimes.get(session.pk)
    assert runtime is not None and runtime.channel_name and runtime.joined_at is not None
    return runtime


def prompts(fake_llm) -> str:
    return "\n".join(r["messages"][1]["content"] for r in fake_llm.requests)


async def test_a_group_wake_from_outside_the_runtime_starts_a_cycle(fake_llm, runtimes, private):
    runtime = await live_runtime(runtimes, private, fake_llm)
    # Stored without the signal: only the group message can tell the runtime.
    await sync_to_async(inbound_store)(session=private, text="did you get this?")
    await get_channel_layer().group_send(session_group(private.pk), {"type": "session.wake", "reason": "message"})
    [_first, second] = await finished_cycles(private, 2)
    assert (
        second.trigger == "1 new message(s)"
        and "Alice: did you get this?" in fake_llm.requests[1]["messages"][1]["content"]
    )
    assert runtimes.get(private.pk) is runtime  # woken, not restarted


async def test_wake_session_soon_from_a_worker_thread(fake_llm, runtimes, private):
    await live_runtime(runtimes, private, fake_llm)
    await sync_to_async(inbound_store)(session=private, text="from a thread")
    assert await sync_to_async(wake_session_soon)(private.pk) is True
    await finished_cycles(private, 2)
    assert "Alice: from a thread" in fake_llm.requests[1]["messages"][1]["content"]
    # The blocking helper is for processes without a loop; in an asgiref worker thread it refuses.
    with pytest.raises(RuntimeError):
        await sync_to_async(wake_session_from_sync_process)(private.pk)


async def test_coalescing_wakes_lose_no_message(fake_llm, runtimes, private):
    runtime = await live_runtime(runtimes, private, fake_llm)
    texts = [f"burst {i}" for i in range(6)]
    for text in texts:
        await sync_to_async(inbound_store)(session=private, text=text)
    # Fewer wakes than messages, all at once: they coalesce, and observing by primary key finds all six.
    await asyncio.gather(wake_session(private.pk), wake_session(private.pk))
    last = await sync_to_async(lambda: private.messages.filter(direction="in").order_by("pk").last().pk)()

    async def all_observed():
        return runtime.last_seen_pk == last and not runtime.busy

    await wait_for_async(all_observed, what="every message observed")
    cycles = await finished_cycles(private, 2)
    observed = sum(int(c.trigger.split()[0]) for c in cycles[1:])
    assert observed == len(texts)  # each message observed exactly once
    assert all(f"Alice: {t}" in prompts(fake_llm) for t in texts)


async def test_a_message_the_runtime_does_not_know_is_dropped_and_it_keeps_running(fake_llm, runtimes, private):
    runtime = await live_runtime(runtimes, private, fake_llm)
    layer = get_channel_layer()
    await layer.group_send(session_group(private.pk), {"type": "session.bogus"})
    await layer.group_send(session_group(private.pk), {"type": "send", "text": "not a handler"})
    await sync_to_async(inbound_store)(session=private, text="still there?")
    await wake_session(private.pk)
    await finished_cycles(private, 2)
    assert runtimes.get(private.pk) is runtime and not runtime.task.done()


async def test_a_consumer_that_ends_takes_its_planner_loop_with_it(fake_llm, runtimes, private):
    runtime = await live_runtime(runtimes, private, fake_llm)
    runtime.task.cancel()  # as if its channel receive had failed

    async def ended():
        return runtime.task.done() and runtime.planner_task is None and runtimes.get(private.pk) is None

    await wait_for_async(ended, what="the consumer and its loop to end")
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):  # it left its group on the way out
        assert runtime.channel_name not in layer.groups.get(session_group(private.pk), {})
    # The next message starts a fresh runtime.
    await say(private, "again")
    await finished_cycles(private, 2)
    assert runtimes.get(private.pk) not in (None, runtime)


@needs_redis
async def test_a_wake_through_a_separate_redis_layer_reaches_the_runtime(fake_llm, runtimes, private):
    from channels_redis.core import RedisChannelLayer

    runtime = await live_runtime(runtimes, private, fake_llm)
    assert isinstance(get_channel_layer(), RedisChannelLayer)
    # Another layer instance (its own client prefix and connection pool), as the cluster process has.
    cluster = RedisChannelLayer(hosts=[settings.REDIS_URL])
    assert cluster is not get_channel_layer() and cluster.client_prefix != get_channel_layer().client_prefix
    try:
        await sync_to_async(inbound_store)(session=private, text="from the cluster")
        assert await wake_session(private.pk, layer=cluster) is True
        await finished_cycles(private, 2)
        assert "Alice: from the cluster" in fake_llm.requests[1]["messages"][1]["content"]
    finally:
        await cluster.close_pools()
    # A process with no event loop (a plain thread here) uses the blocking helper.
    await sync_to_async(inbound_store)(session=private, text="from a loopless process")
    assert await asyncio.to_thread(wake_session_from_sync_process, private.pk) is True
    await finished_cycles(private, 3)
    assert "Alice: from a loopless process" in fake_llm.requests[2]["messages"][1]["content"]
    assert runtimes.get(private.pk) is runtime
