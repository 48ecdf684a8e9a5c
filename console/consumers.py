"""The live log websocket (/ws/admin/logs/): tails the LogEntry table, which both the ASGI server and the
cluster write to, for operators only.

Client → server: {"type": "level", "min_level": 30} changes the level filter (the backlog is re-sent).
Server → client: {"type": "lines", "reset": bool, "lines": [{id, time, level, logger, module, line,
message, process}]}.
"""

from __future__ import annotations

import asyncio
import logging

from django.utils import timezone

from core.aio import db
from core.config import get_config
from core.models import LogEntry
from core.websocket import JsonFrameConsumer

POLL_SECONDS = 0.3
BACKLOG = 200
PAGE = 500
LOOKBACK = 50
CLOSE_FORBIDDEN = 4403


def _may_view(user) -> bool:
    return bool(user and user.is_active and user.is_staff and user.has_perm("maibot.view_console"))


def _backlog(min_level: int) -> list[LogEntry]:
    rows = list(LogEntry.objects.filter(level__gte=min_level).order_by("-id")[:BACKLOG])
    rows.reverse()
    return rows


def _after(last_id: int) -> list[LogEntry]:
    # Look back a little: two processes' inserts may commit out of id order (PostgreSQL), so a row
    # with a lower id can appear after a higher one was already sent. Seen ids are skipped by the caller.
    return list(LogEntry.objects.filter(id__gt=last_id - LOOKBACK).order_by("id")[:PAGE])


def _newest_id() -> int:
    return LogEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _as_dict(entry: LogEntry, tz) -> dict:
    return {
        "id": entry.id,
        "time": timezone.localtime(entry.created_at, tz).isoformat(timespec="milliseconds"),
        "level": entry.level_name,
        "levelno": entry.level,
        "logger": entry.logger,
        "module": entry.module,
        "line": entry.line,
        "message": entry.message,
        "process": entry.process,
    }


class LogStreamConsumer(JsonFrameConsumer):
    async def connect(self) -> None:
        if not await db(_may_view, fresh=True)(self.scope.get("user")):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.min_level = logging.INFO
        self.last_id = 0
        self._tail: asyncio.Task | None = None
        self._seen: set[int] = set()
        await self.accept()
        await self._restart()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "_tail", None) is not None:
            self._tail.cancel()

    async def receive_json(self, content: dict, **kwargs) -> None:
        if content.get("type") == "level":
            try:
                self.min_level = max(0, min(int(content.get("min_level", logging.INFO)), logging.CRITICAL))
            except (TypeError, ValueError):
                await self.send_error("min_level must be a number such as 20 or 40")
                return
            await self._restart()

    async def _restart(self) -> None:
        if self._tail is not None:
            self._tail.cancel()
        rows = await db(_backlog, fresh=True)(self.min_level)
        # Tail from the newest row of any level, so raising the filter does not replay old lines.
        self.last_id = max([r.id for r in rows] + [await db(_newest_id, fresh=True)()])
        self._seen = {r.id for r in rows}
        await self._send(rows, reset=True)
        self._tail = asyncio.create_task(self._follow())

    async def _send(self, rows: list[LogEntry], *, reset: bool = False) -> None:
        tz = get_config().tzinfo
        await self.send_json({"type": "lines", "reset": reset, "lines": [_as_dict(r, tz) for r in rows]})

    async def _follow(self) -> None:
        while True:
            rows = [r for r in await db(_after, fresh=True)(self.last_id) if r.id not in self._seen]
            if rows:
                self._seen.update(r.id for r in rows)
                self.last_id = max(self.last_id, rows[-1].id)
                self._seen = {i for i in self._seen if i > self.last_id - LOOKBACK}
                visible = [r for r in rows if r.level >= self.min_level]
                if visible:
                    await self._send(visible)
                if len(rows) >= PAGE - LOOKBACK:
                    continue
            await asyncio.sleep(POLL_SECONDS)
