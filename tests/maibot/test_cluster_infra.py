"""The infrastructure restarted under a running deployment, live: a Redis and a PostgreSQL of the
test's own (never the machine's, which other suites use) restarted while an ASGI server, a task cluster
and the real maim_message client (the NapCat stand-in) run on them. Neither process is restarted: each
recovers by itself, wake-ups fall back to polling while Redis is away, and nothing is lost or doubled."""

from __future__ import annotations

import os
import sys
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from chat.models import ChatSession, Message
from maibot.management.commands.serve import daphne_argv
from scheduling.models import Actor, ScheduledMessage
from tests.chat.gateway_helpers import envelope
from tests.chat.napcat_standin import NapCatStandIn
from tests.cluster_support import PrivatePostgres, PrivateRedis, kill_tree, listening
from tests.conftest import Proc, db, free_port, subprocess_env, wait_for, wait_for_async

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.live,
    # It brings its own PostgreSQL and Redis, so it is the same test in either suite: CI runs it once, in
    # the PostgreSQL + Redis suite (`make test-postgres`), whose deployment it is about.
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="runs in the PostgreSQL + Redis suite (make test-postgres): it brings its own PostgreSQL and Redis",
    ),
]

# The due messages are written by this process straight into the private database, whose Redis this
# process's notifier does not reach: the cluster finds them by its poll, kept short here.
SERVER_CONFIG = "[gateway]\noutbox_poll_seconds_with_redis = 1.0\n[scheduling]\npoll_interval = 0.5\n"
ALIAS = "private"


def private_alias(port: int) -> None:
    """The private PostgreSQL as a database alias of this test process (it writes the due messages)."""
    connections.settings[ALIAS] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "maibot",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "ATOMIC_REQUESTS": False,
        "AUTOCOMMIT": True,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "OPTIONS": {},
        "TIME_ZONE": None,
        "TEST": {"NAME": None, "CHARSET": None, "COLLATION": None, "MIGRATE": True, "MIRROR": None},
    }


def private():
    """This thread's connection to the private database, opened explicitly: the test case allows only
    the databases it was set up with to connect implicitly (connect() itself is not guarded)."""
    conn = connections[ALIAS]
    if conn.connection is None:
        conn.connect()
    return conn


def forget_private_alias() -> None:
    if ALIAS in connections.settings:
        connections[ALIAS].close()
        del connections.settings[ALIAS]


@pytest.fixture
def infra(tmp_path, transactional_db, request):
    request.addfinalizer(forget_private_alias)
    pg = PrivatePostgres().init()
    request.addfinalizer(pg.remove)
    redis = PrivateRedis(tmp_path).start()
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres", autocommit=True) as c:
        c.execute("CREATE DATABASE maibot")
    data = tmp_path / "data"
    data.mkdir()
    (data / "bot_config.toml").write_text(SERVER_CONFIG, encoding="utf-8")
    env = {
        **subprocess_env(MAIBOT_DATA_DIR=str(data), MAIBOT_CONSOLE_SERVICES="0", MAIBOT_Q_NAME="infra"),
        "DATABASE_URL": pg.url("maibot"),
        "REDIS_URL": redis.url,
    }
    # Migrated from this process (Django is loaded already): a subprocess would import it all again.
    private_alias(pg.port)
    private()
    try:
        call_command("migrate", database=ALIAS, verbosity=0, interactive=False)
    finally:
        connections[ALIAS].close()
    port = free_port()
    server = Proc(daphne_argv("127.0.0.1", port, keepalive_seconds=15), env, tmp_path / "web.log")
    cluster = Proc([sys.executable, "manage.py", "qcluster"], env, tmp_path / "cluster.log")
    procs = [server, cluster]
    try:
        cluster.wait_for_output("dispatcher started", timeout=60)
        assert wait_for(lambda: listening(port), timeout=60), server.output()
        yield pg, redis, server, cluster, f"http://127.0.0.1:{port}"
    finally:
        # Everything here is the test's own (database, Redis): no need for a graceful stop.
        for proc in procs:
            kill_tree(proc)
            proc.stop()
        redis.stop()


async def test_redis_and_postgres_restarted_under_a_running_server_and_cluster(infra):
    pg, redis, server, cluster, base = infra
    platform = "qq"
    adapter = await NapCatStandIn(base, platform=platform).start()
    try:

        async def inbound(text: str) -> None:
            await adapter.router.clients[platform].send_message(envelope(platform=platform, user_id=777, text=text))

            def stored() -> bool:
                private()
                try:
                    return Message.objects.using(ALIAS).filter(direction="in", text=text).exists()
                finally:
                    connections[ALIAS].close()

            await wait_for_async(stored, timeout=40, what=f"{text!r} stored")

        async def schedule_and_deliver(text: str) -> None:
            def create() -> None:
                private()
                try:
                    session = ChatSession.objects.using(ALIAS).get(platform=platform, user_id="777")
                    due = timezone.now() + timedelta(seconds=0.5)
                    ScheduledMessage.objects.using(ALIAS).create(
                        session=session,
                        chat_type="private",
                        message_text=text,
                        send_at=due,
                        due_at=due,
                        created_via=Actor.SYSTEM,
                    )
                finally:
                    connections[ALIAS].close()

            await db(create)

            async def arrived() -> bool:
                return text in adapter.napcat.texts()

            await wait_for_async(arrived, timeout=40, what=f"{text!r} at the adapter")

        await inbound("hello")  # creates the session
        await schedule_and_deliver("with redis and postgres")

        redis.stop()
        await schedule_and_deliver("redis down")  # the server's safety-net poll
        await inbound("inbound while redis is down")
        redis.start()
        await schedule_and_deliver("redis back")

        pg.restart()
        await schedule_and_deliver("postgres restarted")
        await inbound("inbound after the postgres restart")
    finally:
        await adapter.stop()
    assert server.popen.poll() is None and cluster.popen.poll() is None
    seen = Counter(adapter.napcat.texts())
    for text in ["with redis and postgres", "redis down", "redis back", "postgres restarted"]:
        assert seen[text] == 1, seen
