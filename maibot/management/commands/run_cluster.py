"""`manage.py run_cluster`: the multi-process deployment on one machine — HAProxy in front of two ASGI
servers, and two task clusters — supervised like `serve` by maibot.supervisor (a child that dies is
restarted with backoff, the others keep running; Ctrl-C or SIGTERM stops them all).

Meant for PostgreSQL (DATABASE_URL) and Redis (REDIS_URL): every process shares the database, the
channel layer and the django-q2 queue. On the embedded default it still runs (the SQLite file is shared
through WAL; the servers poll the outbox) but that is not a scale-out, and it says so.
"""

from __future__ import annotations

import logging
import os
import shutil

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from core.config import get_config
from core.listen import open_urls
from maibot.management.commands.serve import Command as ServeCommand
from maibot.management.commands.serve import (
    child_spec,
    daphne_argv,
    exec_supervisor,
    manage_argv,
    trusted_proxies_env,
)

logger = logging.getLogger("maibot.serve")

HAPROXY_CONFIG = settings.BASE_DIR / "config" / "haproxy.cfg"
WEB_SERVERS = 2  # config/haproxy.cfg names web1 and web2
# Where the balancer's connections to the servers come from: the one proxy the servers trust (its
# X-Forwarded-For carries the client's address). Every process on this host can reach the servers'
# ports and would be believed too: the host is trusted as a whole.
BALANCER_ADDRESS = "127.0.0.1"


def web_server_env() -> dict[str, str]:
    """What a server behind the balancer is started with (tests and benchmarks start them the same)."""
    return trusted_proxies_env(BALANCER_ADDRESS)


def haproxy_argv(config: str = str(HAPROXY_CONFIG)) -> list[str]:
    """HAProxy in the foreground (-db) as master-worker (-W): SIGTERM stops it, SIGUSR2 reloads it."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    return [binary, "-W", "-db", "-f", config]


def haproxy_env(bind: str, servers: list[str]) -> dict[str, str]:
    """The variables config/haproxy.cfg reads."""
    return {"MAIBOT_LB_BIND": bind, **{f"MAIBOT_WEB{i}": addr for i, addr in enumerate(servers, 1)}}


def ensure_postgres_database() -> None:
    """Create DATABASE_URL's database when the server has none of that name (bootstrap then migrates)."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        return
    import psycopg
    from psycopg import sql

    kwargs = {"host": db.get("HOST") or "127.0.0.1", "port": db.get("PORT") or 5432, "dbname": "postgres"}
    if db.get("USER"):
        kwargs["user"] = db["USER"]
    if db.get("PASSWORD"):
        kwargs["password"] = db["PASSWORD"]
    with psycopg.connect(**kwargs, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))


class Command(ServeCommand):
    help = "Run HAProxy, two ASGI servers and the task clusters (PostgreSQL + Redis), restarting any that dies."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST, help="where the balancer listens")
        parser.add_argument("--port", type=int, default=settings.PORT, help="the balancer's port")
        parser.add_argument(
            "--web-port",
            type=int,
            default=None,
            help="the first ASGI server's port on 127.0.0.1 (the next ones follow); default: --port + 1",
        )
        parser.add_argument(
            "--prepare",
            action="store_true",
            help="first create DATABASE_URL's database if missing, migrate and create the operator (bootstrap)",
        )
        parser.add_argument("--clusters", type=int, default=2, choices=range(1, 9), metavar="1..8")

    def handle(self, *args, **options) -> None:
        host, port = options["host"], options["port"]
        web_port = options["web_port"] or port + 1
        if not shutil.which("haproxy") and not os.path.exists("/usr/sbin/haproxy"):
            raise CommandError("haproxy is not installed (Debian: apt-get install haproxy)")
        if options["prepare"]:
            ensure_postgres_database()
            call_command("bootstrap", setup_page=False)
        self.prepare()
        if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" or not settings.REDIS_URL:
            self.stderr.write(
                "warning: without DATABASE_URL (PostgreSQL) and REDIS_URL this is no scale-out: the processes "
                "share one SQLite file and the servers poll for outbound messages"
            )
        keepalive = get_config().gateway.keepalive_seconds
        servers = [f"127.0.0.1:{web_port + i}" for i in range(WEB_SERVERS)]
        balancer = haproxy_argv()
        children = [child_spec("balancer", balancer, env=haproxy_env(f"{host}:{port}", servers), listen=(host, port))]
        for i, addr in enumerate(servers, 1):
            web = ("127.0.0.1", int(addr.rsplit(":", 1)[1]))
            argv = daphne_argv(*web, keepalive_seconds=keepalive)
            children.append(child_spec(f"web{i}", argv, env=web_server_env(), listen=web))
        clusters = options["clusters"]
        for i in range(1, clusters + 1):
            children.append(child_spec(f"cluster{i}", manage_argv("qcluster")))
        banner = self.style.SUCCESS(
            f"maibot cluster is starting: HAProxy, {WEB_SERVERS} servers, {clusters} clusters"
        ) + cluster_banner(host, port, servers)
        # The balancer first: no new request reaches a server that is stopping.
        exec_supervisor({"children": children, "banner": banner, "first": 1, "stopped": "maibot cluster stopped"})


def cluster_banner(host: str, port: int | str, servers: list[str]) -> str:
    """The start-up lines after the title: addresses a browser can open (for a wildcard bind, 127.0.0.1 and
    this machine's own addresses, never 0.0.0.0: core.listen), then the servers, database and Redis."""
    base, *others = (url.rstrip("/") for url in open_urls(host, port))
    database = settings.DATABASES["default"]
    return (
        f"\n  operator console: {base}/admin/"
        + "".join(f"\n                    {other}/admin/" for other in others)
        + f"\n  API docs:         {base}/api/v1/docs"
        + f"\n  adapters connect: {base.replace('http://', 'ws://')}/ws"
        + f"\n  servers:          {', '.join(servers)} (behind the balancer)"
        + f"\n  database:         {database['ENGINE'].rsplit('.', 1)[1]} {database['NAME']}"
        + f"\n  redis:            {'yes' if settings.REDIS_URL else 'no'}"
    )
