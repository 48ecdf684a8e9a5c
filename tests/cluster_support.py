"""Real multi-process deployments for the fault tests and bench/scaleout.py: HAProxy (Debian's, with
config/haproxy.cfg) in front of ASGI servers started as `run_cluster` starts them, a private Redis and a
private PostgreSQL the tests may restart (never the machine's: other suites use those)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from maibot.management.commands.run_cluster import haproxy_argv, haproxy_env, web_server_env
from maibot.management.commands.serve import daphne_argv
from tests.conftest import ROOT, Proc, descendants, free_port, subprocess_env, wait_for


def require(binary: str, package: str) -> str:
    """A system program the test needs; missing, the test fails (never skipped): `.ci/run` installs it."""
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None)
    if path is None:
        pytest.fail(f"{binary} is missing: install Debian's {package} (apt-get install -y {package})")
    return path


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def kill_tree(proc: Proc) -> None:
    """SIGKILL a process and everything it started (a machine losing that process, workers and all)."""
    below = descendants(proc.popen.pid)
    proc.popen.send_signal(signal.SIGKILL)
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.popen.wait()


class Deployment:
    """HAProxy on a port of its own in front of two ASGI servers (trusting it as their proxy), all
    against the test database. `env` goes to the servers (e.g. REDIS_URL); each server's data dir gets
    `bot_config` as its bot_config.toml."""

    def __init__(self, root: Path, *, bot_config: str = "", **env: str) -> None:
        self.root = root
        self.env = env
        self.bot_config = bot_config
        self.lb_port = free_port()
        self.ports = [free_port(), free_port()]
        self.servers: list[Proc | None] = [None, None]
        self.balancer: Proc | None = None
        self._runs = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.lb_port}"

    def start(self) -> Deployment:
        require("haproxy", "haproxy")
        # The servers start together (each takes seconds to import and listen).
        for proc, port in [(self._spawn(i), port) for i, port in enumerate(self.ports)]:
            self._wait_listening(proc, port)
        addrs = [f"127.0.0.1:{p}" for p in self.ports]
        self.balancer = Proc(
            haproxy_argv(), {**os.environ, **haproxy_env(f"127.0.0.1:{self.lb_port}", addrs)}, self.root / "haproxy.log"
        )
        if not wait_for(lambda: listening(self.lb_port), timeout=20):
            raise TimeoutError(f"haproxy did not listen:\n{self.balancer.output()}")
        return self

    def start_server(self, i: int) -> Proc:
        """Start (or start again, on the same port) server i, once it listens."""
        proc = self._spawn(i)
        self._wait_listening(proc, self.ports[i])
        return proc

    def _spawn(self, i: int) -> Proc:
        from core import config as bot_config

        self._runs += 1
        data = self.root / f"data-web{i + 1}"
        data.mkdir(parents=True, exist_ok=True)
        (data / "bot_config.toml").write_text(self.bot_config, encoding="utf-8")
        keepalive = bot_config.parse_config(self.bot_config).gateway.keepalive_seconds
        proc = Proc(
            daphne_argv("127.0.0.1", self.ports[i], keepalive_seconds=keepalive),
            subprocess_env(MAIBOT_DATA_DIR=str(data), MAIBOT_CONSOLE_SERVICES="0", **{**web_server_env(), **self.env}),
            self.root / f"web{i + 1}-{self._runs}.log",
        )
        self.servers[i] = proc
        return proc

    @staticmethod
    def _wait_listening(proc: Proc, port: int) -> None:
        def up() -> bool:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"daphne exited:\n{proc.output()}")
            return listening(port)

        if not wait_for(up, timeout=60):
            proc.stop()
            raise TimeoutError(f"daphne did not listen:\n{proc.output()}")

    def holder(self, platform: str) -> int:
        """Which server holds the adapter connection of `platform` (from its log)."""
        needle = f"<ws {platform} "
        for i, proc in enumerate(self.servers):
            if proc is not None and proc.popen.poll() is None and f"adapter {needle}" in proc.output():
                return i
        raise AssertionError(f"no server logged the adapter of {platform}")

    def kill_server(self, i: int) -> None:
        proc = self.servers[i]
        assert proc is not None
        kill_tree(proc)
        proc.stop()

    def stop(self) -> None:
        """Killed, not stopped: nothing of theirs outlives the tests (a graceful stop takes seconds)."""
        for p in [self.balancer, *self.servers]:
            if p is not None:
                if p.popen.poll() is None:
                    kill_tree(p)
                p.stop()


class PrivateRedis:
    """A redis-server of the test's own on a free port, without persistence: it may be restarted."""

    def __init__(self, root: Path) -> None:
        self.binary = require("redis-server", "redis-server")
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"],
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_for(lambda: listening(self.port), timeout=20):
            raise TimeoutError("redis-server did not listen")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb into a temporary dir, pg_ctl on a free port, trust
    authentication on 127.0.0.1 only): it may be restarted without touching the machine's."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not bins:
            pytest.fail("PostgreSQL's server programs are missing (apt-get install -y postgresql)")
        self.bin = bins[-1].parent
        # A directory of its own outside pytest's (root's 0700 tmp dirs): as root, the server runs as
        # the postgres user, who must reach it. remove() deletes it.
        self.root = Path(tempfile.mkdtemp(prefix="maibot-pg-"))
        self.data = self.root / "pgdata"
        self.port = free_port()

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin / args[0]), *args[1:]]
        # initdb and postgres refuse to run as root: as root, run them as the postgres user.
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            log = self.root / "pg.log"
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr}\n{log.read_text() if log.exists() else ''}")

    def url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def init(self) -> PrivatePostgres:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        return self.start()

    def start(self) -> PrivatePostgres:
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{self.root}' -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "pg.log"), "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        """Stop it at once and delete its files."""
        self.stop(mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def restart(self) -> None:
        self.stop()  # pg_ctl -w: returns once it is down
        self.start()


@contextlib.contextmanager
def _above_the_load():
    """This thread at nice -10 while inside (when allowed): a poller starved of the CPU under a loaded
    machine sees a short-lived state late, or never."""
    thread = threading.get_native_id()
    niceness = os.getpriority(os.PRIO_PROCESS, thread)
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, thread, -10)
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, thread, niceness)


def _freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: _all_threads_stopped(pid), timeout=10, interval=0.001), "SIGSTOP did not stop it"


def kill_while_claimed(platform: str, pid: int, timeout: float = 30) -> tuple[str, float, list[int]]:
    """SIGKILL `pid` (the server holding `platform`'s adapter) while it holds a claim of that platform's
    outbound rows: the database is polled without pause, as a claim lasts only as long as its hand-over,
    from a thread raised above the load. Seen a claim, the claimer is kept from finishing it: a
    transaction takes the write lock (SQLite's BEGIN IMMEDIATE; on PostgreSQL the claimed rows, FOR
    UPDATE), so the server's mark of its hand-over waits, and the rows it still holds are read under it:
    some, and the process is frozen (SIGSTOP, until every thread has stopped) and killed holding exactly
    those; none (the hand-over was marked between the poll and the lock), and it is watched for its next
    claim. A freeze alone came too late under load: a hand-over can end faster than every thread of a
    busy process stops. Returns (the claimer's instance, the kill's wall-clock time, the rows it left
    claimed); the caller reaps the process."""
    from django.db import transaction

    from chat.models import Message

    claimed = Message.objects.filter(session__platform=platform, delivery_status="sending")
    with _above_the_load():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            claimer = claimed.values_list("delivery_claimed_by", flat=True).first()
            if not claimer:
                continue
            with transaction.atomic():
                held = claimed.filter(delivery_claimed_by=claimer).select_for_update(of=("self",))
                left = list(held.values_list("pk", flat=True))
                if left:
                    _freeze(pid)
                    os.kill(pid, signal.SIGKILL)
                    return claimer, time.time(), left
    states = Message.objects.filter(session__platform=platform).values_list("delivery_status", flat=True)
    raise AssertionError(f"no claim of {platform}'s rows held in {timeout}s: {Counter(states)}")


def freeze_tree_when(proc: Proc, ready, timeout: float = 40) -> None:
    """Freeze `proc` and everything it started (SIGSTOP) as soon as `ready()` holds, polled without
    pause from a thread raised above the load (a burst may be over before a starved poller sees it
    start). The caller kills or continues them."""
    with _above_the_load():
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline, f"not ready in {timeout}s"
        for pid in [proc.popen.pid, *descendants(proc.popen.pid)]:
            with contextlib.suppress(ProcessLookupError):
                _freeze(pid)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (T), or has ended (Z)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "Z") for state in states)  # a zombie runs nothing either


def heartbeat_name(instance: str) -> str | None:
    """host:pid of the process whose heartbeat row is `instance`."""
    from core.models import ProcessHeartbeat

    return ProcessHeartbeat.objects.filter(instance=instance).values_list("name", flat=True).first()


def check_arrivals_after_kill(delivered, texts: list[str], *, moved: float) -> tuple[dict[str, float], list[str]]:
    """What a NapCat stand-in received around a server's death (`delivered`: its `Delivered` list;
    `moved`: when the adapter's connection to the live server opened). Asserts that every text arrived,
    that the live server handed each over at most once, and that a text came twice only as one copy
    from the dead server (written before its death, its echo lost with it: the receipt trade-off) and
    one from the live server. Returns (the first arrival's wall-clock time per text, the texts that
    came twice)."""
    arrivals: dict[str, list[float]] = {}
    for d in delivered:
        text = "".join(part["data"]["text"] for part in d.message if part["type"] == "text")
        arrivals.setdefault(text, []).append(d.at)
    missing = [t for t in texts if t not in arrivals]
    assert not missing, f"{len(missing)} never arrived: {missing[:10]}"
    after = {t: sum(1 for at in arrivals[t] if at >= moved) for t in texts}
    assert set(after.values()) <= {0, 1}, [t for t, c in after.items() if c > 1][:10]
    twice = [t for t in texts if len(arrivals[t]) > 1]
    assert all(after[t] == 1 and len(arrivals[t]) == 2 for t in twice), [(t, arrivals[t]) for t in twice][:10]
    return {t: arrivals[t][0] for t in texts}, twice


def repeats_on_record(seen: Counter, *, platforms: list[str]) -> dict[str, int]:
    """Asserts that each text the platform saw more than once (`seen`: arrivals per text) was handed
    over again on the record: its outbound row counts at least as many hand-overs as arrivals (its echo
    missed the deployment's confirm window, as on a loaded machine: the receipt trade-off). Never a copy
    the row does not account for. Returns the repeated texts and their arrival counts. (Call it on a
    database thread.)"""
    from chat.models import Message

    twice = {text: count for text, count in seen.items() if count > 1}
    attempts = dict(
        Message.objects.filter(direction="out", session__platform__in=platforms, text__in=list(twice)).values_list(
            "text", "delivery_attempts"
        )
    )
    assert all(attempts.get(text, 0) >= count for text, count in twice.items()), (twice, attempts)
    return twice


def data_dir_with(root: Path, name: str, bot_config: str) -> Path:
    data = root / name
    data.mkdir(parents=True, exist_ok=True)
    (data / "bot_config.toml").write_text(bot_config, encoding="utf-8")
    return data


__all__ = [
    "ROOT",
    "Deployment",
    "PrivatePostgres",
    "PrivateRedis",
    "check_arrivals_after_kill",
    "data_dir_with",
    "descendants",
    "heartbeat_name",
    "kill_tree",
    "kill_while_claimed",
    "repeats_on_record",
]
