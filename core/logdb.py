"""The logging handler that copies log records into the LogEntry table (for the live log page).

It sits in settings.LOGGING for every process but stays inactive (drops nothing, stores nothing) until
the ASGI server or the cluster calls `activate()`: management commands (migrate) and the test process
never write logs to the database. Records are queued in memory and written in batches by one
background thread per process, which sleeps while nothing is queued; records logged while writing are
ignored (no recursion), and a missing table or an unreachable database only loses that batch. Retention
is bounded by rows and by age (pruned as records are written).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

FLUSH_INTERVAL = 0.25  # seconds between batch writes
BATCH_SIZE = 500
QUEUE_LIMIT = 10_000  # records kept in memory while the database is slow; the oldest are dropped
PRUNE_INTERVAL = 60.0

# Loggers whose records would feed back into this handler (its own SQL) or add noise.
_IGNORED_PREFIXES = ("django.db.backends", "core.logdb")


class DatabaseLogHandler(logging.Handler):
    """Buffers INFO+ records and writes them to core.models.LogEntry from a background thread."""

    def __init__(self, level: int | str = logging.INFO) -> None:
        super().__init__(level)
        self.process_role = ""
        self._active = False
        self._queue: collections.deque[dict] = collections.deque(maxlen=QUEUE_LIMIT)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._last_prune = 0.0
        self._formatter = logging.Formatter()
        _handlers.append(self)

    # -- life cycle -----------------------------------------------------------------------------
    def activate(self, process_role: str) -> None:
        self.process_role = process_role
        self._active = True
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        # After a fork (django-q2 workers) the writer thread did not come along: start a new one.
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._queue.clear()
            self._wake = threading.Event()
            self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="maibot-log-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.shutdown()
        super().close()

    def shutdown(self, timeout: float = 5) -> None:
        """Write what is queued, then stop the writer thread."""
        if self._thread is None or self._pid != os.getpid():
            return
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None
        self._active = False

    # -- logging.Handler ------------------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        if not self._active or record.name.startswith(_IGNORED_PREFIXES):
            return
        if threading.current_thread() is self._thread:
            return  # logged while writing a batch: storing it could loop forever
        if record.levelno < _min_level():
            return
        try:
            message = record.getMessage()
            if record.exc_info:
                message = f"{message}\n{self._formatter.formatException(record.exc_info)}"
            elif record.exc_text:
                message = f"{message}\n{record.exc_text}"
            self._queue.append(
                {
                    "created_at": datetime.fromtimestamp(record.created, tz=UTC),
                    "level": record.levelno,
                    "level_name": record.levelname[:16],
                    "logger": record.name[:255],
                    "module": (record.module or "")[:255],
                    "line": record.lineno or 0,
                    "message": message[:20_000],
                    "process": self.process_role,
                    "pid": os.getpid(),
                }
            )
            self._ensure_thread()
            if len(self._queue) == 1 or len(self._queue) >= BATCH_SIZE:
                self._wake.set()  # the first of a batch (the writer sleeps until then), or a full one
        except Exception:
            self.handleError(record)

    # -- the writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        stop, wake = self._stop, self._wake
        while True:
            # Asleep while nothing is queued (no wake-ups at idle): the first record queued wakes it,
            # and what comes within FLUSH_INTERVAL goes into the same batch.
            wake.wait()
            wake.clear()
            if not stop.is_set() and len(self._queue) < BATCH_SIZE:
                stop.wait(FLUSH_INTERVAL)
            self.flush_queue()
            if stop.is_set():
                break
        from django.db import connection

        connection.close()

    def flush_queue(self) -> int:
        """Write queued records; returns how many were written."""
        written = 0
        while self._queue:
            batch = []
            while self._queue and len(batch) < BATCH_SIZE:
                batch.append(self._queue.popleft())
            try:
                from core.models import LogEntry

                LogEntry.objects.bulk_create([LogEntry(**row) for row in batch])
                written += len(batch)
            except Exception as exc:
                # No table yet (before migrate), or the database is away: this batch is lost, the
                # process goes on. Not logged through logging: that would queue yet another record.
                print(f"core.logdb: dropped {len(batch)} log records: {exc}", file=sys.stderr)
                _close_broken_connection()
                return written
        if time.monotonic() - self._last_prune > PRUNE_INTERVAL:
            self._last_prune = time.monotonic()
            try:
                log_entries_prune()
            except Exception as exc:
                print(f"core.logdb: pruning failed: {exc}", file=sys.stderr)
                _close_broken_connection()
        return written


_handlers: list[DatabaseLogHandler] = []


def _close_broken_connection() -> None:
    from django.db import close_old_connections

    try:
        close_old_connections()
    except Exception:
        pass


def _min_level() -> int:
    from core.config import get_config

    try:
        return logging.getLevelName(get_config().console.log_level)
    except Exception:
        return logging.INFO


def activate(process_role: str) -> None:
    """Start storing log records from this process (the ASGI server: "web"; the cluster: "cluster")."""
    for handler in _handlers:
        handler.activate(process_role)


def shutdown() -> None:
    for handler in _handlers:
        handler.shutdown()


def log_entries_prune(now: datetime | None = None) -> int:
    """Delete log lines beyond the retention (rows and days) the console config sets."""
    from core.config import get_config
    from core.models import LogEntry

    cfg = get_config().console
    now = now or datetime.now(UTC)
    deleted, _ = LogEntry.objects.filter(created_at__lt=now - timedelta(days=cfg.log_retention_days)).delete()
    newest = LogEntry.objects.order_by("-id").values_list("id", flat=True).first()
    if newest is not None:
        more, _ = LogEntry.objects.filter(id__lte=newest - cfg.log_retention_rows).delete()
        deleted += more
    return deleted
