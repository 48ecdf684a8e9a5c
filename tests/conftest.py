"""Shared fixtures: known bot config, chat sessions, an injected clock, the one polling helper
(`wait_for`, with its async twin `wait_for_async`) and real subprocesses (qcluster, daphne) that run
against the test database.

Two tiers: a test that starts a real server or cluster process, a real maim_message client or Chromium
is marked `live`; the rest (`-m "not live"`, `make test-fast`) run in-process. Live tests that only need
"a live server" share one daphne (`shared_server`) and one qcluster (`shared_qcluster`) for the whole
session; tests that kill or restart processes or need their own settings or data dir start their own
(`start_server`, `start_qcluster`). Live tests run after the fast tier, and the tests that use the shared
cluster run last, so a running shared cluster never claims work a test expects to handle itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from core import config as bot_config
from maibot.management.commands.serve import daphne_argv
from tests import forkserver

ROOT = Path(__file__).resolve().parent.parent

# Fixtures that start real processes: a test using one must be marked `live`.
LIVE_FIXTURES = {"start_server", "start_qcluster", "shared_server", "shared_qcluster"}


def pytest_collection_modifyitems(config, items) -> None:
    """Check the `live` marks, then order: the fast tier, the live tier, and last the tests that use the
    shared cluster (it keeps running until the session ends); `long` tests first within each."""
    unmarked = [
        item.nodeid
        for item in items
        if LIVE_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("live") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests that start real processes must be marked live:\n  " + "\n  ".join(unmarked))

    def tier(item) -> tuple[int, int]:
        # Within a tier the `long` tests go first: with parallel workers (pytest-xdist) the suite then
        # never waits at its end for one worker's single long test.
        long = 0 if item.get_closest_marker("long") else 1
        if item.get_closest_marker("live") is None:
            return 0, long
        return (2 if "shared_qcluster" in getattr(item, "fixturenames", ()) else 1), long

    items.sort(key=tier)


# The rows the migrations write (post_migrate) and no test changes: the flush after a transactional test
# keeps them.
MIGRATION_ROWS = ("django_content_type", "auth_permission")


def _migration_rows_state(conn) -> list[tuple]:
    with conn.cursor() as cursor:
        state = []
        for table in MIGRATION_ROWS:
            cursor.execute(f"SELECT COUNT(*), MAX(id) FROM {conn.ops.quote_name(table)}")
            state.append(cursor.fetchone())
        return state


def quick_flush() -> Callable[[Any], None]:
    """TransactionTestCase's teardown, to the same empty tables: every table emptied by DELETE in one
    transaction. Django's own flush TRUNCATEs every table (slow on PostgreSQL) and then writes the content
    types and permissions anew (post_migrate); here those rows stay as the migrations wrote them, and
    should a test have changed them, Django's flush runs instead."""
    from django.db import connections, transaction
    from django.test import TransactionTestCase

    django_flush = TransactionTestCase._fixture_teardown
    expected = {alias: _migration_rows_state(connections[alias]) for alias in connections}

    def flush(test_case) -> None:
        aliases = test_case._databases_names(include_mirrors=False)
        if any(_migration_rows_state(connections[alias]) != expected[alias] for alias in aliases):
            django_flush(test_case)
            expected.update({alias: _migration_rows_state(connections[alias]) for alias in aliases})
            return
        for alias in aliases:
            conn = connections[alias]
            tables = set(conn.introspection.django_table_names(only_existing=True, include_views=False))
            with transaction.atomic(using=alias), conn.cursor() as cursor:
                for table in sorted(tables - set(MIGRATION_ROWS)):
                    cursor.execute(f"DELETE FROM {conn.ops.quote_name(table)}")

    return flush


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's test database, flushed after each transactional test by `quick_flush`, and dropped
    cleanly at the end on PostgreSQL too: worker threads of this process (the outbox's executor,
    sync_to_async's pool) still hold connections of their own, which would make the DROP fail ("being
    accessed by other users") and leave the database behind."""
    from django.test import TransactionTestCase

    with pytest.MonkeyPatch.context() as patch:
        with django_db_blocker.unblock():
            patch.setattr(TransactionTestCase, "_fixture_teardown", quick_flush())
        yield
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()


@pytest.fixture(autouse=True, scope="session")
def no_console_services_in_test_process(django_test_environment) -> None:
    """The test process never starts the config watcher or log writer by importing maibot.asgi; the
    servers and clusters the tests spawn do (tests may start them explicitly). A gateway a test starts
    runs the heartbeat while it runs: its deliverer's claims rest on it."""
    from django.conf import settings

    settings.MAIBOT_CONSOLE_SERVICES = False


@pytest.fixture(autouse=True)
def no_heartbeat_outlives_its_test() -> Iterator[None]:
    """Each in-process test has its own event loop, and a gateway started on it without being closed
    never releases the heartbeat its deliverer holds (the loop closes under it): stop it at the end."""
    yield
    from core.process import heartbeat_release

    heartbeat_release(all_users=True)


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
def fast_password_hashing(request) -> Iterator[None]:
    """In-process tests hash passwords with a cheap hasher (users are made in many setups). Live tests
    keep the real one: the servers they start must verify the passwords they log in with."""
    if request.node.get_closest_marker("live") is not None:
        yield
        return
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def deployment_env_pinned(monkeypatch) -> Iterator[None]:
    """deployment.env's live refresh (core.deployment_env.refresh) applies in a test only what the test
    itself writes there, and what it applied (the environment's secrets, the adapter tokens) is undone after;
    the secrets a test's process held (redacted for the life of a real process) are forgotten after it."""
    from django.conf import settings

    from core import deployment_env

    monkeypatch.setattr(deployment_env, "_applied_stat", deployment_env._stat(deployment_env.default_path()))
    monkeypatch.setattr(deployment_env, "_from_file", set(deployment_env._from_file))
    monkeypatch.setattr(deployment_env, "_held", set(deployment_env._held))
    monkeypatch.setattr(settings, "MAIBOT_ADAPTER_TOKENS", settings.MAIBOT_ADAPTER_TOKENS)
    # Restored by hand: monkeypatch.delenv of an unset name records nothing, so a name a refresh sets
    # during the test would outlive it (and reach every server a later test starts).
    before = {name: os.environ.get(name) for name in deployment_env._live_names()}
    yield
    for name in set(before) | deployment_env._live_names():
        if before.get(name) is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]


@pytest.fixture(autouse=True)
def data_dir_config_file_restored() -> Iterator[None]:
    """The worker's data dir is shared by its tests: a test that saves bot_config.toml there (through the
    console, as an operator would) leaves the next tests the file it found."""
    from django.conf import settings

    path = Path(settings.DATA_DIR) / "bot_config.toml"
    before = path.read_bytes() if path.exists() else None
    yield
    after = path.read_bytes() if path.exists() else None
    if after == before:
        return
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(before)


@pytest.fixture(autouse=True)
def default_bot_config() -> Iterator[bot_config.BotConfig]:
    """Every test starts from the documented defaults, whatever the data dir's file says (and no bot
    account learned by an earlier test is remembered)."""
    from chat.accounts import forget_cached_accounts

    forget_cached_accounts()
    old = bot_config.loading._current
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
        return session_get_or_create(platform=platform, chat_type=chat_type, **kw)

    return make


class FakeClock:
    """An injected `now` callable: time stands still until the test advances it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    """A clock starting at a fixed instant in the middle of a minute (never near a boundary)."""
    from django.utils import timezone

    start = timezone.now().replace(second=30, microsecond=0)
    return FakeClock(start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _polls(timeout: float, interval: float) -> Iterator[float]:
    """The one polling rule: yield the pause before each next try until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        yield interval


def wait_for(predicate: Callable[[], object], timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    for pause in _polls(timeout, interval):
        if predicate():
            return True
        time.sleep(pause)
    return False


async def db(fn: Callable, *args, **kwargs) -> Any:
    """Run ORM code from an async test; the thread's connection is closed so teardown can drop the DB."""

    def run():
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return await sync_to_async(run, thread_sensitive=False)()


async def wait_for_async(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """The async twin of `wait_for` (same polls): a coroutine function is awaited, a plain function
    (ORM code) runs through `db`. Returns the first truthy value; AssertionError after `timeout`."""
    check = predicate if inspect.iscoroutinefunction(predicate) else lambda: db(predicate)
    for pause in _polls(timeout, interval):
        value = await check()
        if value:
            return value
        await asyncio.sleep(pause)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child process that must use the same (test) database as this test."""
    from django.conf import settings

    # A child is not a test worker: it takes the data dir, database and Redis of this worker as given,
    # never a worker's suffix of its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    # PYTHONFAULTHANDLER: a child that has to be aborted (Proc.stop) prints every thread's stack first.
    env.update(PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1", SECRET_KEY=settings.SECRET_KEY)
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    env.update(extra)
    sd = connection.settings_dict
    if sd["ENGINE"] == "django.db.backends.sqlite3":
        env["DATABASE_URL"] = f"sqlite:///{sd['NAME']}"
    else:
        user = sd.get("USER") or ""
        pw = f":{sd['PASSWORD']}" if sd.get("PASSWORD") else ""
        auth = f"{user}{pw}@" if user else ""
        env["DATABASE_URL"] = f"postgres://{auth}{sd.get('HOST') or '127.0.0.1'}:{sd.get('PORT') or 5432}/{sd['NAME']}"
    return env


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (from /proc), e.g. a qcluster's workers, found before it is killed."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _in_session(sid: int) -> list[int]:
    """The live processes of session `sid` (a zombie has ended: its parent has only not reaped it yet)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


# Every Proc a test started: what is still running of them when the session ends is killed, even when
# a test was cut short inside its own clean-up (pytest-timeout).
_STARTED: list[Proc] = []


def pytest_sessionfinish(session, exitstatus) -> None:
    for proc in _STARTED:
        proc.kill_session()
    forkserver.close()


class Proc:
    """A child process with its output captured to a file, stopped with SIGTERM."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._fh = log.open("wb")
        self._signalled = False
        self.outlived: list[int] = []  # what `stop` found still running after the process was gone
        # A session of its own: whatever it starts (a server's cluster in a process group of its own
        # too) can be found, and killed, after it is gone.
        # Servers and clusters come from the worker's fork server (tests.forkserver: their imports done
        # once); anything else is a plain child process.
        if forkserver.usable(args):
            self.popen = forkserver.spawn(args, env, str(log), str(ROOT))
        else:
            self.popen = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        _STARTED.append(self)

    def output(self) -> str:
        if not self._fh.closed:
            self._fh.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, needle: str, timeout: float = 30) -> None:
        def seen() -> bool:
            if needle in self.output():
                return True
            if self.popen.poll() is not None:
                raise RuntimeError(f"process exited ({self.popen.returncode}):\n{self.output()}")
            return False

        if not wait_for(seen, timeout=timeout):
            raise TimeoutError(f"{needle!r} not seen in {timeout}s:\n{self.output()}")

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None and not self._signalled:
            self._signalled = True
            self.popen.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the process, wait up to `timeout`, then abort it (SIGABRT: its threads' stacks go to its
        output, PYTHONFAULTHANDLER) and SIGKILL it. Whatever it started and left alive
        (a server's cluster, when the server had to be killed) is killed after a short grace and listed
        in `outlived`: no process of a test works on into later tests."""
        if self.popen.poll() is None:
            self.terminate(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.send_signal(signal.SIGABRT)
                try:
                    self.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait()
        if not wait_for(lambda: not _in_session(self.popen.pid), timeout=5):
            self.outlived.extend(self.kill_session())
        self._fh.close()
        return self.popen.returncode

    def kill_session(self) -> list[int]:
        """SIGKILL every process left in this process's session; the pids."""
        left = _in_session(self.popen.pid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


def stop_all(procs: list[Proc]) -> None:
    """Stop processes together: every one is told first, so their shutdowns overlap."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.stop()


def launch_qcluster(data_dir: Path, log: Path, **env: str) -> Proc:
    """A real `manage.py qcluster` against the test database, once its dispatcher runs."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = Proc(
        [sys.executable, "manage.py", "qcluster"],
        subprocess_env(MAIBOT_DATA_DIR=str(data_dir), MAIBOT_Q_NAME=f"test-{os.getpid()}", **env),
        log,
    )
    proc.wait_for_output("dispatcher started", timeout=60)
    return proc


def launch_daphne(data_dir: Path, log: Path, **env: str) -> tuple[Proc, str]:
    """A real ASGI server (daphne, with the command line `serve` gives it, including the keepalive of the
    data dir's bot_config.toml) on 127.0.0.1 against the test database, once it listens. Returns
    (process, "http://127.0.0.1:PORT")."""
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    config_file = data_dir / "bot_config.toml"
    config = bot_config.parse_config(config_file.read_text()) if config_file.exists() else bot_config.BotConfig()
    proc = Proc(
        daphne_argv("127.0.0.1", port, keepalive_seconds=config.gateway.keepalive_seconds),
        subprocess_env(MAIBOT_DATA_DIR=str(data_dir), **env),
        log,
    )

    def listening() -> bool:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"daphne exited:\n{proc.output()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    if not wait_for(listening, timeout=60):
        proc.stop()
        raise TimeoutError(f"daphne did not listen on {port}:\n{proc.output()}")
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def start_qcluster(tmp_path, transactional_db) -> Iterator[Callable[..., Proc]]:
    """Start real `manage.py qcluster` processes of this test's own against the test database."""
    procs: list[Proc] = []

    def start(name: str = "q1", **env: str) -> Proc:
        proc = launch_qcluster(tmp_path / f"data-{name}", tmp_path / f"{name}.log", **env)
        procs.append(proc)
        return proc

    yield start
    stop_all(procs)


@pytest.fixture
def start_server(tmp_path, transactional_db) -> Iterator[Callable[..., tuple[Proc, str]]]:
    """Start a real ASGI server of this test's own (daphne) against the test database.

    Returns (process, "http://127.0.0.1:PORT"). Extra keyword arguments become environment variables;
    its data dir (with its bot_config.toml) is tmp_path / f"data-{name}".
    """
    procs: list[Proc] = []

    def start(name: str = "web", **env: str) -> tuple[Proc, str]:
        proc, base = launch_daphne(tmp_path / f"data-{name}", tmp_path / f"{name}.log", **env)
        procs.append(proc)
        return proc, base

    yield start
    stop_all(procs)


# The shared processes run without the console services (config watcher, log writer): they would write
# log lines into the database other tests look at. (Their heartbeats they write all the same: the claims
# they make rest on them.)
SHARED_ENV = {"MAIBOT_CONSOLE_SERVICES": "0"}
# The adapter tokens the shared server accepts (MAIBOT_ADAPTER_TOKENS), each bound to one platform: these
# two to qq; every other platform a live test connects as has its own (shared_adapter_token).
SHARED_ADAPTER_TOKENS = ("shared-adapter-token", "shared-adapter-token-2")
SHARED_ADAPTER_PLATFORMS = ("qq068", "probe", "narrow", "wechat", "mcptest", "discord")


def shared_adapter_token(platform: str) -> str:
    """The shared server's token for `platform` (qq: SHARED_ADAPTER_TOKENS[0])."""
    if platform == "qq":
        return SHARED_ADAPTER_TOKENS[0]
    assert platform in SHARED_ADAPTER_PLATFORMS, f"add {platform!r} to SHARED_ADAPTER_PLATFORMS"
    return f"shared-adapter-token-{platform}"


def shared_adapter_tokens_env() -> str:
    """The shared server's MAIBOT_ADAPTER_TOKENS."""
    bound = [f"qq:{token}" for token in SHARED_ADAPTER_TOKENS]
    bound += [f"{platform}:{shared_adapter_token(platform)}" for platform in SHARED_ADAPTER_PLATFORMS]
    return ",".join(bound)


class LogView:
    """A shared process seen from one test: its output since the test started, so a test only ever
    finds the log lines it caused (and never one an earlier test left)."""

    def __init__(self, proc: Proc) -> None:
        self.proc = proc
        self.popen = proc.popen
        self._start = len(proc.output())

    def output(self) -> str:
        return self.proc.output()[self._start :]

    def wait_for_output(self, needle: str, timeout: float = 30) -> None:
        def seen() -> bool:
            if needle in self.output():
                return True
            if self.popen.poll() is not None:
                raise RuntimeError(f"process exited ({self.popen.returncode}):\n{self.proc.output()}")
            return False

        if not wait_for(seen, timeout=timeout):
            raise TimeoutError(f"{needle!r} not seen in {timeout}s:\n{self.output()}")


@pytest.fixture(scope="session")
def _shared_daphne(django_db_setup, tmp_path_factory) -> Iterator[tuple[Proc, str]]:
    root = tmp_path_factory.mktemp("shared-server")
    proc, base = launch_daphne(
        root / "data", root / "daphne.log", MAIBOT_ADAPTER_TOKENS=shared_adapter_tokens_env(), **SHARED_ENV
    )
    yield proc, base
    proc.stop()


@pytest.fixture(scope="session")
def _shared_cluster(django_db_setup, tmp_path_factory) -> Iterator[Proc]:
    root = tmp_path_factory.mktemp("shared-cluster")
    proc = launch_qcluster(root / "data", root / "qcluster.log", **SHARED_ENV)
    yield proc
    proc.stop()


def _still_running(proc: Proc) -> None:
    if proc.popen.poll() is not None:
        pytest.fail(f"the shared process exited ({proc.popen.returncode}):\n{proc.output()}")


@pytest.fixture
def shared_server(_shared_daphne, transactional_db) -> tuple[LogView, str]:
    """(the process's log since this test began, base URL) of the session's daphne with the default
    settings; adapters authenticate with SHARED_ADAPTER_TOKENS. The test's data must be committed
    (transactional_db) for the server to see it; the test must not stop or reconfigure it, and must
    disconnect the adapters it connected."""
    _still_running(_shared_daphne[0])
    return LogView(_shared_daphne[0]), _shared_daphne[1]


@pytest.fixture
def shared_qcluster(_shared_cluster, transactional_db) -> Proc:
    """The session's qcluster (dispatcher and workers) with the default settings; see shared_server."""
    _still_running(_shared_cluster)
    return _shared_cluster


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
