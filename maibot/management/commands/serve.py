"""`manage.py serve`: the ASGI server (daphne) and the task cluster together, for one machine, supervised.

This command checks the data dir and works out the children's command lines, then becomes the supervisor
(exec of maibot.supervisor, a process of the standard library alone), which prints the URLs, restarts a
child that dies (backoff 1 s doubling to 30 s), logs that to the console's log, stops everything with one
line naming the fix when another program holds the port, and on Ctrl-C or SIGTERM stops both children
and whatever they started (see maibot.supervisor for the invariants).
"""

from __future__ import annotations

import json
import os
import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from core import datadir, deployment_env
from core.config import get_config
from core.listen import open_urls
from core.networks import parse_networks
from maibot import supervisor

# Adapter frames carry base64 media: accept up to 100 MiB (daphne's default is 1 MiB), and never
# drop a websocket for its age (daphne's default closes it after a day).
DAPHNE_OPTIONS = [
    "--websocket-max-message-size",
    str(100 * 1024 * 1024),
    "--websocket-max-frame-size",
    str(100 * 1024 * 1024),
    "--websocket_timeout",
    "-1",
]
ASGI_APPLICATION = "maibot.asgi:application"
# daphne looks at its websockets every 2 s (Server.timeout_checker) and autobahn fires its ping timeouts
# in 0.2 s buckets.
DAPHNE_CHECK_SECONDS = 2.0
DAPHNE_TIMER_SLACK = 0.2


def keepalive_options(keepalive_seconds: float) -> list[str]:
    """daphne's ping options so that a dead or frozen peer is dropped within `keepalive_seconds`.

    What they do (daphne 4.2, autobahn): each 2 s daphne pings every websocket that sent nothing for
    `--ping-interval` seconds (it counts a ping sent as activity too); autobahn drops the connection
    (abort) when that ping's pong has not come within `--ping-timeout`. So a peer that froze right after
    its last frame is dropped at most interval + 2 s + timeout + 0.2 s later. The timeout stays shorter
    than the interval: autobahn does not cancel a ping's timeout when it sends the next ping, so a
    second ping before the first one's timeout would drop a live peer whose answer came to the first.
    Both are whole seconds (daphne's command line takes integers).
    """
    timeout = max(1, int((keepalive_seconds - 1 - DAPHNE_CHECK_SECONDS - DAPHNE_TIMER_SLACK) / 2))
    return ["--ping-interval", str(timeout + 1), "--ping-timeout", str(timeout)]


def daphne_argv(host: str, port: int, *, keepalive_seconds: float) -> list[str]:
    """The command line of the ASGI server, as `serve` runs it (tests and benchmarks run the same).

    Never daphne's `--proxy-headers`: it believes the left-most X-Forwarded-For entry from any peer.
    The application decides the client address itself, trusting only MAIBOT_TRUSTED_PROXIES
    (maibot.proxies); `trusted_proxies_env` hands that to the server process.
    """
    return [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        host,
        "-p",
        str(port),
        *DAPHNE_OPTIONS,
        *keepalive_options(keepalive_seconds),
        ASGI_APPLICATION,
    ]


def trusted_proxies_env(value: str) -> dict[str, str]:
    """The server process's MAIBOT_TRUSTED_PROXIES (comma-separated CIDRs), checked here so that a bad
    entry stops the supervisor naming it instead of a server that keeps failing to start."""
    try:
        parse_networks(value, name="--trusted-proxies")
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None
    return {"MAIBOT_TRUSTED_PROXIES": value}


def manage_argv(*args: str) -> list[str]:
    """A management command as a child process: through manage.py in the repository, else through the
    installed `maibot` package (pip install, or maibot.pyz, whose shiv bootstrap puts its packages on
    the children's PYTHONPATH)."""
    manage_py = settings.BASE_DIR / "manage.py"
    if manage_py.exists():
        return [sys.executable, str(manage_py), *args]
    return [sys.executable, "-m", "maibot", "manage", *args]


def database_for_log() -> dict:
    """Where the supervisor writes its lines for the console's log (maibot.supervisor.LogTableHandler)."""
    from core.models import LogEntry

    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return {"engine": "sqlite", "name": str(db["NAME"]), "table": LogEntry._meta.db_table}
    connect = {"host": db.get("HOST") or "127.0.0.1", "port": db.get("PORT") or 5432, "dbname": db["NAME"]}
    connect.update({k: db[K] for k, K in (("user", "USER"), ("password", "PASSWORD")) if db.get(K)})
    return {"engine": "postgresql", "connect": connect, "table": LogEntry._meta.db_table}


def child_spec(name: str, argv: list[str], *, env: dict | None = None, listen: tuple[str, int] | None = None) -> dict:
    """One child as the supervisor takes it: run in the project's folder, with the data dir given as an
    absolute path (a relative MAIBOT_DATA_DIR meant the folder `serve` was started in)."""
    env = {"MAIBOT_DATA_DIR": str(settings.DATA_DIR), **(env or {})}
    return {"name": name, "argv": argv, "cwd": str(settings.BASE_DIR), "env": env, "listen": listen}


def exec_supervisor(spec: dict) -> None:
    """Replace this process (a full Django) with the supervisor (the standard library alone), which runs
    `spec` (maibot.supervisor). Never returns."""
    spec = {"database": database_for_log(), "stopped": "maibot stopped", **spec}
    sys.stdout.flush()
    sys.stderr.flush()
    # Without deployment.env's values: every child reads the file itself and follows its changes.
    env = {**deployment_env.real_environ(), supervisor.SPEC_ENV: json.dumps(spec)}
    # `-m` finds the package from the project's folder (a checkout) or from site-packages (installed, or
    # the single file's extraction on PYTHONPATH).
    os.chdir(settings.BASE_DIR)
    os.execve(sys.executable, [sys.executable, "-m", "maibot.supervisor"], env)


class Command(BaseCommand):
    help = "Run the ASGI server and the qcluster (dispatcher + workers) together, restarting either if it dies."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST)
        parser.add_argument("--port", type=int, default=settings.PORT)
        parser.add_argument(
            "--bootstrap",
            action="store_true",
            help="first migrate and see to the operator account (manage.py bootstrap), in this same process",
        )
        parser.add_argument(
            "--trusted-proxies",
            default=None,
            metavar="CIDRS",
            help="comma-separated addresses or networks of the reverse proxies in front of the server, whose "
            "X-Forwarded-For / X-Forwarded-Proto are believed (default: MAIBOT_TRUSTED_PROXIES, else none)",
        )

    def handle(self, *args, **options) -> None:
        host, port = options["host"], options["port"]
        proxies = options["trusted_proxies"]
        if proxies is None:
            proxies = os.environ.get("MAIBOT_TRUSTED_PROXIES", "")
        web_env = trusted_proxies_env(proxies)
        if options["bootstrap"]:
            # One Django start instead of two (make run): a second of the start-up on a small machine.
            call_command("bootstrap")
        self.prepare()
        daphne = daphne_argv(host, port, keepalive_seconds=get_config().gateway.keepalive_seconds)
        # Bound to every address (0.0.0.0, ::): 127.0.0.1 here, and the machine's own addresses from elsewhere.
        base, *others = (url.rstrip("/") for url in open_urls(host, port))
        banner = (
            self.style.SUCCESS("maibot is starting")
            + f"\n  operator console: {base}/admin/"
            + "".join(f"\n                    {other}/admin/" for other in others)
            + f"\n  chat page:        {base}/chat/"
            + f"\n  API docs:         {base}/api/v1/docs"
            + f"\n  adapters connect: {base.replace('http://', 'ws://')}/ws"
            + f"\n  data dir:         {settings.DATA_DIR}"
            + f"\n  trusted proxies:  {proxies or 'none (X-Forwarded-For is ignored)'}"
        )
        exec_supervisor(
            {
                "children": [
                    child_spec("web", daphne, env=web_env, listen=(host, port)),
                    child_spec("cluster", manage_argv("qcluster")),
                ],
                "banner": banner,
            }
        )

    def prepare(self) -> None:
        """Refuse a data dir newer than this code."""
        try:
            datadir.check_not_newer()
        except datadir.DataDirTooNew as exc:
            raise CommandError(f"Refusing to start: {exc}") from None
