"""What an idle session runtime costs (issue #18: 10,000 live runtimes in one process): no planner task,
one timer for its next timed event, one task (its consumer, awaiting its channel; channels_redis adds
two helper tasks to a waiting receive);
and the cap's eviction by recent activity. Offline mode (the tests' default config): no model needed."""

import asyncio

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from chat import runtime as runtime_module
from chat import session_runtime
from chat.models import ChatSession, PlannerCycle
from core import config
from tests.chat.planner_helpers import fake_llm_fixture, runtimes_fixture, say  # noqa: F401
from tests.conftest import wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)

IDLE = {"debounce_seconds": 0.05, "idle_evict_seconds": 600}


async def answered(session, n: int = 1) -> None:
    async def check() -> bool:
        return await PlannerCycle.objects.filter(session=session, ended_at__isnull=False).acount() >= n

    await wait_for_async(check, what=f"{n} offline answer(s) in session {session.pk}")


async def idle(runtimes, session):
    """The session's runtime once its work is over."""

    async def check() -> bool:
        runtime = runtimes.get(session.pk)
        return runtime is not None and runtime.planner_task is None

    await wait_for_async(check, what=f"the runtime of session {session.pk} to be idle")
    return runtimes.get(session.pk)


def planner_tasks(session_pk: int) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"planner-work-{session_pk}"]


async def test_an_idle_runtime_holds_no_planner_task_only_a_timer_for_its_next_event(runtimes, make_session):
    session = await asyncio.to_thread(make_session)
    with config.override(chat=IDLE):
        await say(session, "hello")
        await answered(session)
        runtime = await idle(runtimes, session)
        assert planner_tasks(session.pk) == [] and runtime.session is None  # the row is not held either
        # One timer: idle eviction, the earliest of its timed events (the group rejoin is an hour away).
        assert runtime.timer is not None and not runtime.timer.cancelled()
        assert runtime.timer.when() == pytest.approx(runtime.last_activity + 600)

        # News starts the work again; afterwards the runtime is idle again with a fresh timer.
        await say(session, "again")
        await answered(session, 2)
        again = await idle(runtimes, session)
        assert again is runtime and planner_tasks(session.pk) == []
        assert runtime.timer.when() == pytest.approx(runtime.last_activity + 600)


async def test_an_idle_runtime_costs_one_task(runtimes, make_session):
    sessions = [await asyncio.to_thread(make_session) for _ in range(20)]
    with config.override(chat=IDLE):
        before = len(asyncio.all_tasks())
        for session in sessions:
            await say(session, "hello")
        for session in sessions:
            await answered(session)
            await idle(runtimes, session)
        # Each: its consumer alone, which awaits its channel itself (no receive task beside it); the
        # timers are handles, the planner work has ended. channels_redis' receive waits with two helper
        # tasks of its own (its receive lock and the channel's buffer).
        per_runtime = 3 if isinstance(get_channel_layer(), RedisChannelLayer) else 1
        assert len(asyncio.all_tasks()) - before <= per_runtime * len(sessions)
        assert not any(t.get_name().startswith("planner-work-") for t in asyncio.all_tasks())
        assert len(runtimes.runtimes) == 20


async def test_the_rejoin_is_a_timer_and_the_runtime_stays_idle(runtimes, make_session, monkeypatch):
    session = await asyncio.to_thread(make_session)
    monkeypatch.setattr(session_runtime, "REJOIN_SECONDS", 0.3)
    with config.override(chat=IDLE):
        await say(session, "hello")
        await answered(session)
        runtime = await idle(runtimes, session)
        joined = runtime.joined_at

        async def rejoined() -> bool:
            return runtime.joined_at > joined

        await wait_for_async(rejoined, what="the hourly group rejoin (shortened)")
        assert runtimes.get(session.pk) is runtime and runtime.planner_task is None
        assert runtime.timer is not None  # armed again for the next one


async def test_the_cap_stops_the_least_recently_active_not_the_first_started(runtimes, make_session):
    a, b, c = [await asyncio.to_thread(make_session) for _ in range(3)]
    with config.override(chat={**IDLE, "max_runtimes": 2}):
        for session in (a, b):
            await say(session, "hello")
            await answered(session)
            await idle(runtimes, session)
        await say(a, "me again")  # a was started first but is now the most recently active
        await answered(a, 2)
        await idle(runtimes, a)
        await say(c, "hello")
        await answered(c)
        assert runtimes.get(b.pk) is None
        assert runtimes.get(a.pk) is not None and runtimes.get(c.pk) is not None


async def test_a_runtime_whose_session_was_deleted_ends_at_its_next_wake(runtimes, make_session):
    session = await asyncio.to_thread(make_session)
    with config.override(chat=IDLE):
        await say(session, "hello")
        await answered(session)
        runtime = await idle(runtimes, session)  # it holds no session row while idle
        await ChatSession.objects.filter(pk=session.pk).adelete()
        await runtime_module.wake_session(session.pk)

        async def ended() -> bool:
            return runtimes.get(session.pk) is None and runtime.task.done()

        await wait_for_async(ended, what="the runtime of the deleted session to end")


async def test_a_quiet_runtime_lets_its_history_cache_go_and_reads_the_window_again(
    fake_llm, runtimes, make_session, monkeypatch
):
    session = await asyncio.to_thread(make_session, user_nickname="Alice")
    monkeypatch.setattr(session_runtime, "HISTORY_KEEP_SECONDS", 0.3)
    fake_llm.default = lambda body: fake_llm.tool_call("reply", {"text": "noted"})
    await say(session, "my cat is called Miso")
    await answered(session)
    runtime = await idle(runtimes, session)
    assert runtime.history is not None  # kept while the chat is lively

    async def released() -> bool:
        return runtime.history is None

    await wait_for_async(released, what="the quiet runtime to let its history cache go")
    assert runtimes.get(session.pk) is runtime and runtime.timer is not None  # still alive, still armed
    await say(session, "what is my cat called?")
    await answered(session, 2)
    prompt = fake_llm.requests[1]["messages"][1]["content"]
    assert "Alice: my cat is called Miso" in prompt and "noted" in prompt  # the window, read again
