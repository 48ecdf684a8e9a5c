"""`manage.py serve`: the ASGI server (daphne) and the task cluster together, for one machine, supervised.

Prints the URLs. A child that dies is restarted with backoff (1 s, doubling to 30 s; back to 1 s once it
ran a minute), logged and stored in the console's log (the dashboard's recent errors), never a reason to
stop the other. Each child runs in its own process group, so whatever it leaves behind when it dies
(the cluster's workers) is killed with it. On Ctrl-C or SIGTERM each child is asked to stop (SIGTERM to
the child itself: django-q2's cluster stops its own workers), given 30 s, and then its whole group is
killed: after `serve` returns, no process it started is left.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from core import datadir, deployment_env, logdb
from core.config import get_config
from core.networks import parse_networks

logger = logging.getLogger("maibot.serve")

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


STOP_GRACE_SECONDS = 30.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
STABLE_AFTER_SECONDS = 60.0  # a child that ran this long starts its next backoff from the beginning
TICK_SECONDS = 0.2


@dataclass
class Child:
    """One supervised process: its command, the running Popen, and its restart bookkeeping."""

    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = BACKOFF_FIRST
    restarts: int = field(default=0)
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment

    def start(self) -> None:
        # A group of its own: the child and everything it forks can be signalled (and killed) together,
        # and a Ctrl-C in the terminal reaches only `serve`, which stops the children in order.
        self.proc = subprocess.Popen(
            self.argv, cwd=settings.BASE_DIR, env={**os.environ, **self.env}, start_new_session=True
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    def stop(self) -> None:
        """SIGTERM, the grace period, then its whole group killed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()
        if self.proc is not None:
            self.proc.wait()

    def kill_group(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the group is gone already


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


class _Watched:
    """A file whose changes (of its modification time, or its coming and going) are noticed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen = _mtime(path)

    def changed(self) -> bool:
        """True once per change since the last look."""
        now = _mtime(self.path)
        if now == self.seen:
            return False
        self.seen = now
        return True


def _restart(child: Child, reason: str) -> None:
    logger.info("%s changed: restarting the %s to apply it", reason, child.name)
    child.stop()
    child.start()


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Command(BaseCommand):
    help = "Run the ASGI server and the qcluster (dispatcher + workers) together, restarting either if it dies."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.HOST)
        parser.add_argument("--port", type=int, default=settings.PORT)
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
        self.prepare()
        daphne = daphne_argv(host, port, keepalive_seconds=get_config().gateway.keepalive_seconds)
        children = [Child("web", daphne, env=web_env), Child("cluster", manage_argv("qcluster"))]
        base = f"http://{host}:{port}"
        self.start(
            children,
            self.style.SUCCESS("maibot is starting")
            + f"\n  operator console: {base}/admin/"
            + f"\n  chat page:        {base}/chat/"
            + f"\n  API docs:         {base}/api/v1/docs"
            + f"\n  adapters connect: ws://{host}:{port}/ws"
            + f"\n  data dir:         {settings.DATA_DIR}"
            + f"\n  trusted proxies:  {proxies or 'none (X-Forwarded-For is ignored)'}",
        )
        # The set-up page saves the API key and adapter token there; the cluster reads them at start.
        secrets = _Watched(settings.DATA_DIR / deployment_env.FILE_NAME)
        self.supervise(children, tick=lambda: secrets.changed() and _restart(children[1], secrets.path.name))
        self.stdout.write("maibot stopped")

    def prepare(self) -> None:
        """Refuse a data dir newer than this code; log to the console's log from here on."""
        try:
            datadir.check_not_newer()
        except datadir.DataDirTooNew as exc:
            raise CommandError(f"Refusing to start: {exc}") from None
        # The supervisor's own lines (restarts) go to the console's log like the children's.
        logdb.activate("supervisor")

    def start(self, children: list[Child], banner: str) -> None:
        """Start the children and say so (`banner`)."""
        for child in children:
            child.start()
        self.stdout.write(banner + "\nPress Ctrl-C to stop.")
        self.stdout.flush()  # seen at once also when the output goes to a file

    def supervise(self, children: list[Child], *, tick: Callable[[], None] | None = None, first: int = 0) -> None:
        """Until SIGINT or SIGTERM: restart any child that died (with backoff), then `tick()`, each
        TICK_SECONDS. Then stop them all: the first `first` of them one by one, then the rest together."""
        stopping = False

        def stop(signum=None, frame=None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                for child in children:
                    self._supervise(child)
                if tick is not None:
                    tick()
                time.sleep(TICK_SECONDS)
        finally:
            for child in children[:first]:
                child.stop()
            self._stop_all(children[first:])
            logdb.shutdown()

    def _supervise(self, child: Child) -> None:
        now = time.monotonic()
        if child.restart_at is not None:
            if now >= child.restart_at:
                child.restarts += 1
                logger.warning("%s: restarting (restart %d)", child.name, child.restarts)
                child.start()
            return
        code = child.proc.poll()
        if code is None:
            return
        child.kill_group()  # what it left behind (the cluster's workers) goes with it
        if now - child.started_at >= STABLE_AFTER_SECONDS:
            child.backoff = BACKOFF_FIRST
        logger.error("%s %s; restarting in %g s", child.name, _describe(code), child.backoff)
        child.restart_at = now + child.backoff
        child.backoff = min(child.backoff * 2, BACKOFF_MAX)

    def _stop_all(self, children: list[Child]) -> None:
        running = [c for c in children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in running:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"{child.name} did not stop in time; killing it")
        for child in children:
            child.kill_group()
            if child.proc is not None:
                child.proc.wait()
