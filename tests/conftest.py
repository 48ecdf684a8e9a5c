"""Shared fixtures: known bot config, chat sessions, and real subprocesses (qcluster, daphne) that run
against the test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from maibot import config as bot_config
from maibot.management.commands.serve import ASGI_APPLICATION, DAPHNE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def no_console_services_in_test_process(django_test_environment) -> None:
    """The test process never starts the config watcher, log writer or heartbeat by importing
    maibot.asgi; the servers and clusters the tests spawn do (tests may start them explicitly)."""
    from django.conf import settings

    settings.MAIBOT_CONSOLE_SERVICES = False


@pytest.fixture(autouse=True, scope="session")
def empty_task_queue(django_test_environment) -> Iterator[None]:
    """With REDIS_URL the task broker is Redis, which outlives the test database: tasks queued with no
    cluster running (summary refreshes after inbound messages…) would otherwise reach the clusters of
    the next run. (The ORM broker's queue lives in the test database and goes with it.)"""
    from django.conf import settings

    def purge() -> None:
        if settings.REDIS_URL:
            from django_q.brokers import get_broker

            get_broker().purge_queue()

    purge()
    yield
    purge()


@pytest.fixture(autouse=True)
def default_bot_config() -> Iterator[bot_config.BotConfig]:
    """Every test starts from the documented defaults, whatever the data dir's file says."""
    old = bot_config._current
    bot_config.set_config(bot_config.BotConfig())
    yield bot_config.get_config()
    bot_config.set_config(old) if old is not None else None


@pytest.fixture
def make_session(db) -> Callable[..., object]:
    from chat.services import session_get_or_create

    counter = iter(range(10_000, 10_000_000))

    def make(chat_type: str = "private", platform: str = "qq", **kw):
        n = next(counter)
        if chat_type == "private":
            kw.setdefault("user_id", str(n))
            kw.setdefault("user_nickname", f"user{n}")
        else:
            kw.setdefault("group_id", str(n))
            kw.setdefault("group_name", f"group{n}")
            kw.setdefault("user_id", str(n + 1))
        return session_get_or_create(platform=platform, chat_type=chat_type, **kw)

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use the same (test) database as this test."""
    from django.conf import settings

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SECRET_KEY": settings.SECRET_KEY, **extra}
    sd = connection.settings_dict
    if sd["ENGINE"] == "django.db.backends.sqlite3":
        env["DATABASE_URL"] = f"sqlite:///{sd['NAME']}"
    else:
        user = sd.get("USER") or ""
        pw = f":{sd['PASSWORD']}" if sd.get("PASSWORD") else ""
        auth = f"{user}{pw}@" if user else ""
        env["DATABASE_URL"] = f"postgres://{auth}{sd.get('HOST') or '127.0.0.1'}:{sd.get('PORT') or 5432}/{sd['NAME']}"
    return env


class Proc:
    """A child process with its output captured to a file, stopped with SIGTERM."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._fh = log.open("wb")
        self.popen = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT)

    def output(self) -> str:
        if not self._fh.closed:
            self._fh.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, needle: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.output():
                return
            if self.popen.poll() is not None:
                raise RuntimeError(f"process exited ({self.popen.returncode}):\n{self.output()}")
            time.sleep(0.05)
        raise TimeoutError(f"{needle!r} not seen in {timeout}s:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._fh.close()
        return self.popen.returncode


@pytest.fixture
def start_qcluster(tmp_path, transactional_db) -> Iterator[Callable[..., Proc]]:
    """Start real `manage.py qcluster` processes against the test database."""
    procs: list[Proc] = []

    def start(name: str = "q1", **env: str) -> Proc:
        data_dir = tmp_path / f"data-{name}"
        data_dir.mkdir(exist_ok=True)
        proc = Proc(
            [sys.executable, "manage.py", "qcluster"],
            subprocess_env(MAIBOT_DATA_DIR=str(data_dir), MAIBOT_Q_NAME=f"test-{os.getpid()}", **env),
            tmp_path / f"{name}.log",
        )
        procs.append(proc)
        proc.wait_for_output("dispatcher started", timeout=60)
        return proc

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def start_server(tmp_path, transactional_db) -> Iterator[Callable[..., tuple[Proc, str]]]:
    """Start a real ASGI server (daphne, as in production) on 127.0.0.1 against the test database.

    Returns (process, "http://127.0.0.1:PORT"). Extra keyword arguments become environment variables.
    """
    procs: list[Proc] = []

    def start(name: str = "web", **env: str) -> tuple[Proc, str]:
        port = free_port()
        data_dir = tmp_path / f"data-{name}"
        data_dir.mkdir(exist_ok=True)
        proc = Proc(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *DAPHNE_OPTIONS, ASGI_APPLICATION],
            subprocess_env(MAIBOT_DATA_DIR=str(data_dir), **env),
            tmp_path / f"{name}.log",
        )
        procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"daphne exited:\n{proc.output()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise TimeoutError(f"daphne did not listen on {port}:\n{proc.output()}")
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.stop()


# --- headless Chromium (Debian's package; .ci/run installs it) -------------------------------------
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def require_chromium() -> str:
    """The browser's path. A missing browser fails the test: page tests are never silently skipped."""
    import shutil

    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    return CHROMIUM
