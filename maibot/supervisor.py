"""The supervisor of `serve` and `run_cluster`: a small process of the standard library alone that starts the
children, restarts one that dies, and stops them all.

`serve` (a Django command) checks the data dir and works out the children's command lines, then replaces
itself (exec) with `python -m maibot.supervisor`, handing over a JSON spec in MAIBOT_SUPERVISOR_SPEC: what
watches the children for hours needs no Django, no apps and no bot config in its memory.

Invariants: each child runs in its own process group (whatever it forks, e.g. the cluster's workers, dies
with it); a child that dies is restarted with backoff (1 s doubling to 30 s; back to 1 s after it ran a
minute), never a reason to stop the others; a child that listens on a port no other program may hold:
taken before the start, or found taken when that child died, it stops everything with one line naming
the port and the fix, instead of restarting forever. On SIGINT/SIGTERM the first `first` children are
stopped one by one, then the rest together (SIGTERM, 30 s grace, then the group killed): after the
supervisor returns, no process it started is left. Its own lines go to stderr and, when the spec names
the database, to the console's log (the LogEntry table, process "supervisor").
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core.retry import backoff

SPEC_ENV = "MAIBOT_SUPERVISOR_SPEC"
STOP_GRACE_SECONDS = 30.0
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
STABLE_AFTER_SECONDS = 60.0  # a child that ran this long starts its next backoff from the beginning
TICK_SECONDS = 0.2  # how often a child is looked at where its end cannot be waited for (no pidfd)

logger = logging.getLogger("maibot.serve")


class PortTaken(Exception):
    """Another program holds a port a child must listen on."""


def port_in_use_message(host: str, port: int) -> str:
    """The one line an operator reads when the port is taken: what, and how to fix it."""
    return (
        f"port {port} is in use on {host}: another program (perhaps another maibot) is listening there. "
        f"Stop it (`ss -ltnp 'sport = :{port}'` shows which one) or choose another port: "
        f"PORT={port + 1} (make run PORT={port + 1}, manage.py serve --port {port + 1})."
    )


def port_taken(host: str, port: int) -> bool:
    """Whether binding host:port fails because it is in use, tried as the servers bind (SO_REUSEADDR, so a
    connection of a past run in TIME_WAIT does not count)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False  # an unknown host name: the server itself reports it
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


@dataclass
class Child:
    """One supervised process: its command, the running Popen, and its restart bookkeeping."""

    name: str
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the supervisor's environment
    listen: tuple[str, int] | None = None  # host and port it serves on
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    failures: int = 0  # crashes in a row (a run of STABLE_AFTER_SECONDS ends the row): its backoff
    restarts: int = 0
    pidfd: int | None = None

    def start(self) -> None:
        # A group of its own: the child and everything it forks can be signalled (and killed) together,
        # and a Ctrl-C in the terminal reaches only the supervisor, which stops the children in order.
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env={**os.environ, **self.env}, start_new_session=True)
        self.started_at = time.monotonic()
        self.restart_at = None
        self.close_pidfd()
        try:  # readable when the child ends: the supervisor sleeps until then (Linux 5.3 and newer)
            self.pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

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

    def check_port(self) -> None:
        if self.listen is not None and port_taken(*self.listen):
            raise PortTaken(port_in_use_message(*self.listen))


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Supervisor:
    """Starts `children`, keeps them running until SIGINT/SIGTERM, then stops them (see the module)."""

    def __init__(self, children: list[Child], *, first: int = 0) -> None:
        self.children = children
        self.first = first
        self.stopping = False

    def start(self) -> None:
        """Refuse a taken port before anything starts (PortTaken), then start every child. A SIGINT or
        SIGTERM from here on stops them (in `run`), even one that comes while they are being started."""
        for child in self.children:
            child.check_port()

        def stop(signum=None, frame=None) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for child in self.children:
            child.start()

    def run(self) -> None:
        """Restart any child that died (with backoff) until a signal (or PortTaken from a child that died
        for its port); then stop them all. Between checks it sleeps until a child ends, a signal comes or
        a restart is due (TICK_SECONDS at most where a child's end cannot be waited for)."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous = signal.set_wakeup_fd(wake_write)
        try:
            while not self.stopping:
                for child in self.children:
                    self._supervise(child)
                if not self.stopping:
                    self._sleep(wake_read)
        finally:
            signal.set_wakeup_fd(previous)
            os.close(wake_read)
            os.close(wake_write)
            for child in self.children[: self.first]:
                child.stop()
            self._stop_all(self.children[self.first :])
            for child in self.children:
                child.close_pidfd()

    def _sleep(self, wake: int) -> None:
        now = time.monotonic()
        running = [c for c in self.children if c.restart_at is None]
        due = [c.restart_at - now for c in self.children if c.restart_at is not None]
        if any(c.pidfd is None for c in running):
            due.append(TICK_SECONDS)
        readable, _, _ = select.select(
            [wake, *(c.pidfd for c in running if c.pidfd is not None)], [], [], max(0.0, min(due)) if due else None
        )
        if wake in readable:
            os.read(wake, 512)  # the signals' bytes: the handler has set `stopping`

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
        child.check_port()  # it died because another program took its port: no restart can help
        if now - child.started_at >= STABLE_AFTER_SECONDS:
            child.failures = 0
        child.failures += 1
        delay = backoff(BACKOFF_FIRST, child.failures, most=BACKOFF_MAX)
        logger.error("%s %s; restarting in %g s", child.name, describe_exit(code), delay)
        child.restart_at = now + delay

    def _stop_all(self, children: list[Child]) -> None:
        running = [c for c in children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in running:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", child.name)
        for child in children:
            child.kill_group()
            if child.proc is not None:
                child.proc.wait()


class LogTableHandler(logging.Handler):
    """Copies the supervisor's records into the console's log (the LogEntry table), the few a supervisor
    writes (restarts, config changes) one at a time. A database that is away loses only that line."""

    COLUMNS = "created_at, level, level_name, logger, module, line, message, process, pid"

    def __init__(self, database: dict) -> None:
        super().__init__(logging.INFO)
        self.database = database

    def emit(self, record: logging.LogRecord) -> None:
        created = datetime.fromtimestamp(record.created, tz=UTC)
        row = [record.levelno, record.levelname, record.name, record.module, record.lineno, record.getMessage()]
        try:
            if self.database["engine"] == "sqlite":
                self._insert_sqlite(created, row)
            else:
                self._insert_postgresql(created, row)
        except Exception as exc:
            print(f"maibot.supervisor: the console's log did not take a line: {exc}", file=sys.stderr)

    def _insert_sqlite(self, created: datetime, row: list) -> None:
        import sqlite3

        # As Django stores an aware datetime in SQLite: UTC, without its offset.
        stamp = created.replace(tzinfo=None).isoformat(" ")
        with sqlite3.connect(self.database["name"], timeout=5) as conn:
            conn.execute(
                f"INSERT INTO {self.database['table']} ({self.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [stamp, *row, "supervisor", os.getpid()],
            )
        conn.close()

    def _insert_postgresql(self, created: datetime, row: list) -> None:
        import psycopg  # only when a line is written: most supervisors never need it

        with psycopg.connect(**self.database["connect"], connect_timeout=5) as conn:
            conn.execute(
                f"INSERT INTO {self.database['table']} ({self.COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [created, *row, "supervisor", os.getpid()],
            )


def spec_from_environ() -> dict:
    return json.loads(os.environ.pop(SPEC_ENV))


def main() -> int:
    """Run the spec `serve` handed over: children, banner, the console's log."""
    spec = spec_from_environ()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s %(message)s")
    if spec.get("database"):
        logging.getLogger().addHandler(LogTableHandler(spec["database"]))
    children = [
        Child(c["name"], c["argv"], cwd=c.get("cwd"), env=c.get("env", {}), listen=tuple(c["listen"] or ()) or None)
        for c in spec["children"]
    ]
    supervisor = Supervisor(children, first=spec.get("first", 0))
    try:
        supervisor.start()
        print(spec["banner"] + "\nPress Ctrl-C to stop.", flush=True)  # flushed: seen at once in a log file too
        supervisor.run()
    except PortTaken as exc:
        logger.error("%s", exc)  # the terminal and the console's log: restarting would not help
        return 1
    print(spec.get("stopped", "stopped"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
