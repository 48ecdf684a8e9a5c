"""The multi-process deployment under faults, live: HAProxy (config/haproxy.cfg) in front of two ASGI
servers, task clusters, the real maim_message client (the NapCat stand-in, which echoes deliveries) —
an ASGI server SIGKILLed while it holds the adapter (and while it hands a burst over), a cluster SIGKILLed
mid-burst, Redis restarted, PostgreSQL restarted, and a short mixed load on 2 + 2. The long versions are
bench/scaleout.py."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import AdapterConnection, Message
from chat.services import message_send
from scheduling.models import Actor, ScheduledMessage, ScheduledStatus
from scheduling.wakeups import dispatchers_wake
from tests.chat.napcat_standin import NapCatStandIn
from tests.cluster_support import (
    Deployment,
    check_arrivals_after_kill,
    freeze_tree_when,
    heartbeat_name,
    kill_tree,
    kill_while_claimed,
    repeats_on_record,
)
from tests.conftest import Proc, db, subprocess_env, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

# Short windows keep the scenarios short: a hand-over with no echo is repeated after 2 s (then 4 s).
# The claim leases are the defaults (60 s, 30 s): the claims of a killed server or cluster must come
# back through its heartbeat running out (8 s), never by waiting out a lease. Small dispatcher batches
# make a burst many rounds long, so a kill lands in the middle of it.
SERVER_CONFIG = "[gateway]\nconfirm_seconds = 2.0\nmax_delivery_attempts = 3\n"
CLUSTER_CONFIG = "[scheduling]\nbatch_size = 10\n"
# A SIGKILLed process's in-flight messages reach the adapter within this of their due time, and go out
# within DEAD_CLAIM_AFTER_KILL of the kill: its heartbeat runs out 8 s after its last beat, and the rest of
# the burst follows; a claim that waited out its lease (30 s from the claim, at the due time) would come
# back after 29 s or more. (12 s was missed by 0.14 s at load 13.)
DEAD_CLAIM_LATENESS = 15.0
DEAD_CLAIM_AFTER_KILL = 20.0


@pytest.fixture(scope="module")
def _deployment(django_db_setup, tmp_path_factory):
    """One balanced deployment for the module's scenarios (a test that kills a server starts it again);
    each test uses platforms of its own."""
    dep = Deployment(tmp_path_factory.mktemp("deployment"), bot_config=SERVER_CONFIG).start()
    yield dep
    dep.stop()


@pytest.fixture
def deployment(_deployment, transactional_db) -> Deployment:
    for proc in [_deployment.balancer, *_deployment.servers]:
        assert proc is not None and proc.popen.poll() is None, proc.output() if proc else "not started"
    return _deployment


@pytest.fixture
def clusters(tmp_path, transactional_db):
    """Start qcluster processes of this test's own with CLUSTER_CONFIG, or `config` (together; returned
    once their dispatchers run); all stopped at the end."""
    procs = []

    def start(*names: str, config: str = CLUSTER_CONFIG, **env: str) -> list[Proc]:
        started = []
        for name in names:
            data = tmp_path / f"data-{name}"
            data.mkdir(parents=True, exist_ok=True)
            (data / "bot_config.toml").write_text(config, encoding="utf-8")
            started.append(
                Proc(
                    [sys.executable, "manage.py", "qcluster"],
                    subprocess_env(
                        MAIBOT_DATA_DIR=str(data),
                        MAIBOT_Q_NAME=f"test-{os.getpid()}",
                        MAIBOT_CONSOLE_SERVICES="0",
                        **env,
                    ),
                    tmp_path / f"{name}.log",
                )
            )
        procs.extend(started)
        for proc in started:
            proc.wait_for_output("dispatcher started", timeout=60)
        return started

    yield start
    # Killed, not stopped: a graceful stop takes seconds and this test's rows are flushed anyway.
    for proc in procs:
        if proc.popen.poll() is None:
            kill_tree(proc)
        proc.stop()


async def server_holding(deployment: Deployment, platform: str) -> int:
    """The index of the server holding `platform`'s adapter, once one does."""

    async def held() -> int:
        try:
            return deployment.holder(platform) + 1
        except AssertionError:
            return 0

    return await wait_for_async(held, what=f"the server holding {platform}") - 1


async def all_delivered(ids: list[int], timeout: float = 40) -> None:
    def done():
        return Message.objects.filter(pk__in=ids, delivery_status="delivered").count() == len(ids)

    await wait_for_async(done, timeout=timeout, what=f"{len(ids)} messages delivered")


async def test_adapter_reconnects_through_the_balancer_when_its_server_is_killed(deployment, make_session):
    platform = "qq-lb-kill"
    session = await db(make_session, platform=platform)
    adapter = await NapCatStandIn(deployment.base, platform=platform).start()
    killed = None
    try:
        holder = await server_holding(deployment, platform)
        other = 1 - holder

        async def send(texts: list[str]) -> list[int]:
            def write():
                return [message_send(session=session, source_kind="proactive", text=t).pk for t in texts]

            return await db(write)

        before = await send([f"before {i}" for i in range(5)])
        await all_delivered(before)

        # A burst in flight when its server dies, then more while the adapter is away.
        burst = await send([f"burst {i}" for i in range(50)])
        deployment.kill_server(holder)
        killed = holder
        during = await send([f"during {i}" for i in range(20)])

        # The real client notices the closed socket and reconnects (2 s later) through the balancer,
        # which sends it to the live server.
        await wait_for_async(
            lambda: f"adapter <ws {platform} " in deployment.servers[other].output(),
            timeout=30,
            what="the adapter to reconnect to the other server",
        )
        await all_delivered(before + burst + during, timeout=60)

        # A message from the user after the reconnect is stored (through the live server).
        from tests.chat.gateway_helpers import envelope

        await adapter.router.clients[platform].send_message(
            envelope(platform=platform, user_id=session.user_id, text="after the failover")
        )
        await wait_for_async(
            lambda: Message.objects.filter(session=session, direction="in", text="after the failover").exists(),
            what="the inbound message stored",
        )
    except BaseException:
        if killed is not None and deployment.servers[killed].popen.poll() is not None:
            deployment.start_server(killed)  # failed midway: the module's next scenarios need both servers
        raise
    finally:
        await adapter.stop()

    seen = Counter(adapter.napcat.texts())
    # Delivered before the kill, or written while the adapter was away: exactly once each.
    for text in [f"before {i}" for i in range(5)] + [f"during {i}" for i in range(20)]:
        assert seen[text] == 1, (text, seen[text])
    # In flight at the kill: at least once, and more only as the receipt trade-off allows (a hand-over
    # whose echo died with the server is made again, within max_delivery_attempts).
    for text in [f"burst {i}" for i in range(50)]:
        assert 1 <= seen[text] <= 3, (text, seen[text])

    # The killed server comes back on its port and the balancer sends it work again.
    deployment.start_server(holder)
    import aiohttp

    async with aiohttp.ClientSession(base_url=deployment.base) as client:

        async def both_serve() -> bool:
            async with client.get("/healthz") as response:
                assert response.status in (200, 503)
            return "GET /healthz" in deployment.servers[holder].output()

        await wait_for_async(both_serve, timeout=30, what="the restarted server to get requests again")


async def test_a_cluster_killed_mid_burst_leaves_each_message_sent_exactly_once(deployment, clusters, make_session):
    platform = "qq-burst-kill"
    first, _ = clusters("a", "b")
    sessions = [await db(make_session, platform=platform) for _ in range(40)]
    adapter = await NapCatStandIn(deployment.base, platform=platform).start()
    n = 1000
    try:
        due = timezone.now() + timedelta(seconds=3)

        def create() -> list[int]:
            rows = [
                ScheduledMessage(
                    session=sessions[i % len(sessions)],
                    chat_type="private",
                    message_text=f"due {i}",
                    send_at=due,
                    due_at=due,
                    created_via=Actor.SYSTEM,
                )
                for i in range(n)
            ]
            ScheduledMessage.objects.bulk_create(rows, batch_size=500)
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would
            return [r.pk for r in rows]

        ids = await db(create)

        def sent() -> int:
            return ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count()

        # Frozen the moment the burst is under way, then killed: a burst over before the kill tests nothing.
        await db(freeze_tree_when, first, lambda: sent() >= 20)
        kill_tree(first)
        killed_at = timezone.now()
        at_kill = await db(sent)
        assert at_kill < n, "the burst was over before the kill: nothing was tested"

        await wait_for_async(lambda: sent() == n, timeout=60, what="every message sent")
        # The dead cluster's claimed batch came back through its heartbeat (8 s), not its 30 s lease.
        last = await db(lambda: ScheduledMessage.objects.filter(pk__in=ids).latest("sent_at").sent_at)
        print(
            f"\ncluster killed {(killed_at - due).total_seconds():.2f} s after the due time with {at_kill} of {n} "
            f"sent; the last sent {(last - killed_at).total_seconds():.2f} s after the kill"
        )
        assert (last - killed_at).total_seconds() <= DEAD_CLAIM_AFTER_KILL, last - killed_at

        def outbound() -> list:
            return list(
                Message.objects.filter(source_kind="scheduled_send", session__platform=platform).values_list(
                    "extra__scheduled_message_id", "pk"
                )
            )

        rows = await db(outbound)
        assert len(rows) == n
        assert {r[0] for r in rows} == set(ids)
        await all_delivered([r[1] for r in rows], timeout=60)
    finally:
        await adapter.stop()
    seen = Counter(adapter.napcat.texts())
    assert sorted(seen) == sorted(f"due {i}" for i in range(n))
    # One row each (above); a second copy only as a hand-over on the record.
    await db(repeats_on_record, seen, platforms=[platform])


async def test_a_server_killed_while_handing_a_burst_over_loses_its_claims_within_seconds(
    deployment, clusters, make_session
):
    """The rows a server had claimed when it was SIGKILLed mid-hand-over reach the adapter (back on the
    other server through HAProxy) within DEAD_CLAIM_LATENESS of their due time, not after the 60 s
    delivery lease; once each, but for what the receipt trade-off allows (a frame the dead server
    wrote whose echo died with it is handed over again, once, by the live server)."""
    platform = "qq-claims-kill"
    # The default batches: the outbox hands over up to 500 rows at a time, so the burst is one or two long
    # hand-overs. (1,000 rows made the claim easier to catch but the rest of the burst, after the kill, then
    # missed DEAD_CLAIM_LATENESS by 1 s on PostgreSQL at load; 400 keeps the bound as measured.)
    clusters("k", config="")
    sessions = [await db(make_session, platform=platform) for _ in range(20)]
    adapter = await NapCatStandIn(deployment.base, platform=platform).start()
    holder = None
    n = 400
    try:
        holder = await server_holding(deployment, platform)
        other = 1 - holder
        # A first message proves the connection (the gate) and that the platform echoes.
        warm = await db(message_send, session=sessions[0], source_kind="proactive", text="warm-up")
        await all_delivered([warm.pk])

        due = timezone.now() + timedelta(seconds=2)

        def schedule() -> None:
            ScheduledMessage.objects.bulk_create(
                ScheduledMessage(
                    session=sessions[i % len(sessions)],
                    chat_type="private",
                    message_text=f"burst {i}",
                    send_at=due,
                    due_at=due,
                    created_via=Actor.SYSTEM,
                )
                for i in range(n)
            )
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would

        await db(schedule)

        pid = deployment.servers[holder].popen.pid
        claimer, killed_at, left = await db(kill_while_claimed, platform, pid)
        deployment.kill_server(holder)  # reaped, with whatever it started
        assert await db(heartbeat_name, claimer) == f"{socket.gethostname()}:{pid}", "not the killed server's claim"
        assert left, "the server's claim ended before the kill landed: nothing was tested"

        def outbound_ids() -> list[int]:
            return list(
                Message.objects.filter(session__platform=platform, text__startswith="burst ").values_list(
                    "pk", flat=True
                )
            )

        await wait_for_async(lambda: len(outbound_ids()) == n, timeout=60, what="every outbound row written")
        await all_delivered(await db(outbound_ids), timeout=60)
        reconnected = await db(lambda: AdapterConnection.objects.filter(platform=platform).latest("connected_at"))
        reconnected = reconnected.connected_at
        assert f"adapter <ws {platform} " in deployment.servers[other].output(), "the adapter did not move"
        assert reconnected.timestamp() > killed_at
    finally:
        try:
            await adapter.stop()
        finally:  # the module's next tests need both servers, whatever went wrong here
            if holder is not None and deployment.servers[holder].popen.poll() is not None:
                deployment.start_server(holder)

    burst = [f"burst {i}" for i in range(n)]
    first, twice = check_arrivals_after_kill(adapter.napcat.delivered, burst, moved=reconnected.timestamp())
    lateness = {t: at - due.timestamp() for t, at in first.items()}
    left_texts = await db(lambda: list(Message.objects.filter(pk__in=left).values_list("text", flat=True)))
    print(
        f"\nkilled {killed_at - due.timestamp():.2f} s after the due time holding {len(left)} claimed rows; "
        f"the adapter back {reconnected.timestamp() - killed_at:.2f} s after the kill; those rows arrived "
        f"{min(lateness[t] for t in left_texts):.2f}-{max(lateness[t] for t in left_texts):.2f} s after their due "
        f"time; the burst's latest {max(lateness.values()):.2f} s; {len(twice)} twice (written by the dead server, "
        "echo lost)"
    )
    assert max(lateness.values()) <= DEAD_CLAIM_LATENESS, sorted(lateness.values())[-5:]
    assert max(first.values()) - killed_at <= DEAD_CLAIM_AFTER_KILL


def test_haproxy_config_is_valid():
    """config/haproxy.cfg passes HAProxy's own check with the variables run_cluster sets."""
    import os
    import subprocess

    from maibot.management.commands.run_cluster import HAPROXY_CONFIG, haproxy_env
    from tests.cluster_support import require

    binary = require("haproxy", "haproxy")
    env = {**os.environ, **haproxy_env("127.0.0.1:8000", ["127.0.0.1:8001", "127.0.0.1:8002"])}
    result = subprocess.run([binary, "-c", "-f", str(HAPROXY_CONFIG)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_two_servers_and_two_clusters_under_mixed_load_lose_and_double_nothing(
    deployment, clusters, make_session
):
    """A bounded soak (the hour-long one is bench/scaleout.py --soak): two adapters (one per server),
    inbound messages, scheduled messages due throughout, proactive sends and HTTP requests through the
    balancer, all at once for a few seconds. Nothing lost, and nothing doubled that the rows do not
    record as handed over again."""
    import aiohttp

    from tests.chat.gateway_helpers import envelope

    clusters("m1", "m2")
    platforms = ["qq-mixed-a", "qq-mixed-b"]

    # The first adapter through the balancer; the second straight to the other server (leastconn alone
    # may put both on one: it counts a connection of an earlier scenario still closing, as ci13 saw).
    adapters = [await NapCatStandIn(deployment.base, platform=platforms[0]).start()]
    try:
        other = 1 - await server_holding(deployment, platforms[0])
        direct = f"http://127.0.0.1:{deployment.ports[other]}"
        adapters.append(await NapCatStandIn(direct, platform=platforms[1]).start())
        assert await server_holding(deployment, platforms[1]) == other
        sessions = {p: [await db(make_session, platform=p) for _ in range(10)] for p in platforms}
        seconds, scheduled_each, sent_each, inbound_each = 5, 100, 40, 50
        start = timezone.now() + timedelta(seconds=1)

        def schedule() -> None:
            rows = [
                ScheduledMessage(
                    session=sessions[p][i % 10],
                    chat_type="private",
                    message_text=f"{p} scheduled {i}",
                    send_at=(due := start + timedelta(seconds=seconds * i / scheduled_each)),
                    due_at=due,
                    created_via=Actor.SYSTEM,
                )
                for p in platforms
                for i in range(scheduled_each)
            ]
            ScheduledMessage.objects.bulk_create(rows)
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would

        await db(schedule)

        async def proactive(p: str) -> None:
            for i in range(sent_each):
                s = sessions[p][i % 10]
                await db(message_send, session=s, source_kind="proactive", text=f"{p} proactive {i}")
                await asyncio.sleep(seconds / sent_each)

        async def inbound(adapter: NapCatStandIn, p: str) -> None:
            for i in range(inbound_each):
                frame = envelope(platform=p, user_id=900 + i % 5, text=f"{p} inbound {i}")
                assert await adapter.router.clients[p].send_message(frame)
                await asyncio.sleep(seconds / inbound_each)

        statuses: Counter = Counter()

        async def requests() -> None:
            async with aiohttp.ClientSession(base_url=deployment.base) as client:
                for _ in range(seconds * 10):
                    async with client.get("/healthz") as response:
                        statuses[response.status] += 1
                    await asyncio.sleep(0.1)

        await asyncio.gather(
            *(proactive(p) for p in platforms),
            *(inbound(a, p) for a, p in zip(adapters, platforms, strict=True)),
            requests(),
        )

        def stored_inbound() -> int:
            return Message.objects.filter(direction="in", session__platform__in=platforms).count()

        await wait_for_async(lambda: stored_inbound() >= 2 * inbound_each, timeout=60, what="inbound stored")
        expected = {
            f"{p} {kind} {i}"
            for p in platforms
            for kind, n in (("scheduled", scheduled_each), ("proactive", sent_each))
            for i in range(n)
        }

        async def everything_arrived() -> bool:
            got = set(adapters[0].napcat.texts()) | set(adapters[1].napcat.texts())
            return expected <= got

        await wait_for_async(everything_arrived, timeout=90, what="every outbound message at its adapter")
        # And each confirmed by its echo (a repeat below is the exception, not a lost receipt).
        ids = await db(
            lambda: list(
                Message.objects.filter(direction="out", session__platform__in=platforms, text__in=expected).values_list(
                    "pk", flat=True
                )
            )
        )
        assert len(ids) == len(expected)
        await all_delivered(ids, timeout=60)
    finally:
        for adapter in adapters:
            await adapter.stop()
    # Each where it belongs, once: a second copy only as a hand-over on the record (an echo that missed
    # this deployment's 2 s confirm window on a loaded machine; ci12 saw one on PostgreSQL).
    for adapter, p in zip(adapters, platforms, strict=True):
        seen = Counter(t for t in adapter.napcat.texts() if t.startswith(p + " "))
        assert set(seen) >= {t for t in expected if t.startswith(p + " ")}
        await db(repeats_on_record, seen, platforms=[p])
    texts = await db(
        lambda: list(
            Message.objects.filter(direction="in", session__platform__in=platforms).values_list("text", flat=True)
        )
    )
    assert sorted(texts) == sorted(f"{p} inbound {i}" for p in platforms for i in range(inbound_each))
    assert set(statuses) <= {200, 503} and sum(statuses.values()) == seconds * 10, statuses


async def test_a_socketio_adapter_works_through_the_balancer(deployment, make_session):
    """maim_message 0.7.x starts with Engine.IO long-polling (several HTTP requests of one session) and
    then upgrades to a websocket: every one of them must reach the server that holds the session."""
    from tests.chat.gateway_helpers import Adapter07, envelope

    platform = "qq-lb-socketio"
    adapter = Adapter07(deployment.base, platform=platform)
    try:
        assert await adapter.start() == "connected"
        await adapter.command({"cmd": "send", "frame": envelope(platform=platform, user_id=70007, text="via 0.7")})
        stored = await wait_for_async(
            lambda: Message.objects.filter(direction="in", text="via 0.7", session__platform=platform).first()
        )
        session = await db(lambda: stored.session)
        await db(message_send, session=session, source_kind="proactive", text="to 0.7 via the balancer")
        # The bot answers "via 0.7" too (offline here: no model), before or after the proactive message.
        frames = [json.dumps(await adapter.next_message(), ensure_ascii=False)]
        while "to 0.7 via the balancer" not in frames[-1]:
            assert len(frames) < 2 and "离线模式" in frames[-1], frames
            frames.append(json.dumps(await adapter.next_message(), ensure_ascii=False))
    finally:
        await adapter.stop()
