"""Local wake-ups between the processes that share one outbox on one machine, without Redis.

Every ASGI process binds a Unix datagram socket (an endpoint) in the wake directory; a process that
wrote outbox rows (a qcluster worker, a management command, another ASGI process) sends one byte to
each endpoint there. A wake carries no data, only "look now": the receiver drains its socket and wakes
its outbox deliverer, which claims from the database as always. A lost wake (a full socket buffer, an
endpoint bound a moment too late) costs at most one poll (`gateway.outbox_poll_seconds`), never a
message.

The directory is the database's: on SQLite `<database file>-wake/` beside the file (like its -wal and
-shm), so exactly the processes sharing one database wake each other; otherwise `$MAIBOT_DATA_DIR/wake/`.
It is mode 0700 and each endpoint 0600: only processes of the same user, which can read the database
anyway, can send a wake. Endpoints of processes that died without removing theirs (SIGKILL) refuse
the datagram (ECONNREFUSED); the sender removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

from django.conf import settings
from django.db import connections

logger = logging.getLogger(__name__)

SUFFIX = ".sock"
# sockaddr_un's sun_path holds 108 bytes with the terminating NUL; a longer directory is reached
# through the process's open descriptor of it (/proc/self/fd/N/name), which Linux resolves in full.
MAX_SOCKET_PATH = 107


def wake_dir() -> Path:
    """The wake directory of the default database (see the module docstring)."""
    db = connections["default"].settings_dict
    name = str(db.get("NAME") or "")
    if db["ENGINE"] == "django.db.backends.sqlite3" and name and name != ":memory:" and not name.startswith("file:"):
        return Path(name).resolve().with_name(Path(name).name + "-wake")
    return Path(settings.DATA_DIR) / "wake"


def _prepare(directory: Path) -> bool:
    """Create the directory 0700 (or tighten it); False when it is not this user's to use."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        logger.warning("no local outbox wake-ups: cannot create %s (%s)", directory, exc)
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        logger.warning("no local outbox wake-ups: %s is not a directory owned by this user", directory)
        return False
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return True


class _Addresses:
    """Socket addresses of the files in one directory, short enough for sun_path whatever its length."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None
        self._pid = 0

    def of(self, name: str) -> str:
        full = str(self.directory / name)
        if len(full.encode()) <= MAX_SOCKET_PATH:
            return full
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._pid = os.getpid()
        return f"/proc/self/fd/{self._fd}/{name}"

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None


def _bind(directory: Path, name: str, addresses: _Addresses) -> socket.socket | None:
    """A non-blocking datagram socket bound at `directory`/`name` (mode 0600), or None (logged) where
    none can be: no Unix sockets here, or the directory or the bind refused. The poll alone then."""
    if not hasattr(socket, "AF_UNIX") or not _prepare(directory):
        return None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except OSError as exc:
        logger.warning("no local wake-ups: %s", exc)
        return None
    try:
        sock.setblocking(False)
        sock.bind(addresses.of(name))
        # The 0700 directory already keeps others out; the socket's own mode says the same.
        os.chmod(directory / name, 0o600)
    except OSError as exc:
        sock.close()
        logger.warning("no local wake-ups: cannot bind %s (%s)", directory / name, exc)
        return None
    return sock


def _drain(sock: socket.socket) -> None:
    """Take every wake waiting on `sock`."""
    while True:
        try:
            sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            logger.warning("wake endpoint read failed", exc_info=True)
            return


class WakeEndpoint:
    """This process's endpoint: bound on open, read on the event loop, removed on close."""

    def __init__(self, on_wake: Callable[[], None], directory: Path | None = None) -> None:
        self.on_wake = on_wake
        self.directory = directory or wake_dir()
        self.name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        self.received = 0  # wakes taken (tests)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._addresses = _Addresses(self.directory)

    @property
    def path(self) -> Path:
        return self.directory / self.name

    def open(self, loop: asyncio.AbstractEventLoop) -> bool:
        sock = _bind(self.directory, self.name, self._addresses)
        if sock is None:
            return False
        self._sock, self._loop = sock, loop
        loop.add_reader(sock.fileno(), self._readable)
        _own.add(self.name)
        # Removes the endpoints of processes that died without removing theirs.
        wake_local(directory=self.directory)
        logger.info("outbox wake endpoint %s", self.path)
        return True

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        _drain(sock)  # many wakes that arrived together are one: wake once
        self.received += 1
        self.on_wake()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
        _own.discard(self.name)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._addresses.close()


class WakeInbox:
    """A blocking endpoint, for a thread or process with no event loop (the task queue's pusher): bound on
    first use in each process (a fork binds its own), `wait()` returns when woken or after `timeout`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._sock: socket.socket | None = None
        self._pid = 0
        self._name = ""
        self._addresses = _Addresses(directory)

    def _bound(self) -> socket.socket | None:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        self._pid = os.getpid()
        self._name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}{SUFFIX}"
        self._sock = _bind(self.directory, self._name, self._addresses)
        return self._sock

    def open(self) -> bool:
        """Bind now, before the caller first looks for work: a wake sent after this is never missed."""
        return self._bound() is not None

    def wake(self) -> None:
        """Thread-safe, from this process: end the current (or the next) `wait` at once."""
        sock = self._sock
        if sock is None or self._pid != os.getpid():
            return
        with contextlib.suppress(OSError):  # a full buffer: already woken
            sock.sendto(b"!", self._addresses.of(self._name))

    def close(self) -> None:
        """Unbind and remove the endpoint (senders would remove a stale one anyway)."""
        sock, self._sock = self._sock, None
        if sock is None or self._pid != os.getpid():
            return
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            (self.directory / self._name).unlink()
        self._addresses.close()

    def wait(self, timeout: float) -> bool:
        """Until a wake arrives (True; every wake waiting is taken) or `timeout` passes (False). Without a
        socket (none can be bound here) it just sleeps: the caller's poll still finds the work."""
        sock = self._bound()
        if sock is None:
            time.sleep(timeout)
            return False
        readable, _, _ = select.select([sock], [], [], timeout)
        _drain(sock)
        return bool(readable)


class _Sender:
    """One non-blocking datagram socket per process (a forked worker makes its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pid = 0
        self._addresses: dict[Path, _Addresses] = {}

    def send(self, directory: Path, exclude: Collection[str]) -> int:
        with self._lock:
            if self._sock is None or self._pid != os.getpid():
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
                self._pid = os.getpid()
                self._addresses = {}
            addresses = self._addresses.get(directory)
            if addresses is None:
                addresses = self._addresses[directory] = _Addresses(directory)
            try:
                names = [e.name for e in os.scandir(directory) if e.name.endswith(SUFFIX) and e.name not in exclude]
            except FileNotFoundError:
                return 0
            woken = 0
            for name in names:
                try:
                    self._sock.sendto(b"!", addresses.of(name))
                    woken += 1
                except BlockingIOError:
                    woken += 1  # its buffer is full of wakes it has not read yet: it is awake
                except ConnectionRefusedError:
                    # Nobody is bound to it: its process died without removing it.
                    with contextlib.suppress(FileNotFoundError):
                        (directory / name).unlink()
                        logger.info("removed the stale outbox wake endpoint %s", name)
                except FileNotFoundError:
                    pass  # removed since the scan
                except OSError as exc:
                    logger.warning("could not wake %s: %s", name, exc)
            return woken


_sender = _Sender()
# This process's open endpoints: its own writes wake its deliverer directly, not through a socket.
_own: set[str] = set()


def wake_local(*, directory: Path | None = None) -> int:
    """Wake every endpoint in the wake directory but this process's own; returns how many were
    reached. Never raises: the rows are stored, and pollers deliver them anyway."""
    try:
        return _sender.send(directory or wake_dir(), set(_own))
    except Exception:
        logger.warning("could not send the local outbox wake-ups", exc_info=True)
        return 0
