"""maisaka.*: a plugin adds to a chat's next planner prompt (context.append) or asks the chat's planner
for a turn of its own (proactive.trigger).

Both are kept per chat in this process until that chat's next planner prompt reads them (the context
block "plugin_context", registered by the plugins app): each entry is shown once, in the order it
came, and dropped after ENTRY_TTL unread. proactive.trigger then starts or wakes the chat's runtime
(chat.runtime) with the trigger "proactive", so the planner runs even though nobody wrote. As in
MaiBot, context.append alone never makes the bot speak. What is pending lives in memory: a restart
forgets it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import db, session_of, stream_id_of, text_problem

if TYPE_CHECKING:
    from chat.models import ChatSession
    from plugins.records import PluginRecord

MAX_ENTRIES = 20  # pending entries per chat; the oldest goes first
MAX_ENTRY_CHARS = 2_000
MAX_INTENT_CHARS = 1_000
ENTRY_TTL = 3600.0  # seconds an unread entry is kept
MAX_CHATS = 1_000  # chats with pending entries; the one with the oldest entry goes first
CONTEXT_BLOCK = "plugin_context"


@dataclass(frozen=True)
class Entry:
    plugin_id: str
    kind: str  # "context" | "proactive"
    text: str
    at: float


_pending: dict[str, deque[Entry]] = {}
_lock = threading.Lock()


def _add(session_id: str, entry: Entry) -> int:
    with _lock:
        queue = _pending.get(session_id)
        if queue is None:
            if len(_pending) >= MAX_CHATS:
                oldest = min(_pending, key=lambda k: _pending[k][0].at if _pending[k] else 0.0)
                del _pending[oldest]
            queue = _pending[session_id] = deque(maxlen=MAX_ENTRIES)
        queue.append(entry)
        return len(queue) - 1


def take(session_id: str, now: float | None = None) -> list[Entry]:
    """The chat's pending entries, oldest first, removed (each is shown once)."""
    now = time.monotonic() if now is None else now
    with _lock:
        queue = _pending.pop(session_id, None)
    return [e for e in queue or () if now - e.at <= ENTRY_TTL]


def pending(session_id: str) -> list[Entry]:
    with _lock:
        return list(_pending.get(session_id) or ())


def context_block(session: ChatSession | None) -> str:
    """The planner prompt's block of what plugins added to this chat since its last prompt."""
    if session is None:
        return ""
    lines = []
    for entry in take(session.session_id):
        if entry.kind == "proactive":
            lines.append(f"- plugin {entry.plugin_id} asks you to act: {entry.text}")
        else:
            lines.append(f"- from plugin {entry.plugin_id}: {entry.text}")
    if not lines:
        return ""
    return "Added by plugins for this turn (shown once):\n" + "\n".join(lines)


def register_context_block() -> None:
    from chat.components import register_context_block as register

    register(CONTEXT_BLOCK, context_block, order=150)


def _visible_text(segments: Any, given: Any) -> str:
    if isinstance(given, str) and given.strip():
        return given.strip()
    if not isinstance(segments, list) or not segments:
        return ""
    parts = []
    for seg in segments[:50]:
        if not isinstance(seg, dict):
            continue
        kind = str(seg.get("type") or "").strip().lower()
        data = seg.get("data") if seg.get("data") not in (None, "") else seg.get("content")
        if kind == "text" and isinstance(data, str):
            parts.append(data)
        elif kind:
            description = seg.get("description")
            parts.append(f"[{kind}: {description}]" if isinstance(description, str) and description else f"[{kind}]")
    return "".join(parts).strip()


async def context_append(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    stream_id = stream_id_of(args, "stream_id", "chat_id")
    if not stream_id:
        return {"success": False, "error": "maisaka.context.append needs stream_id"}
    text = _visible_text(args.get("segments"), args.get("visible_text"))
    if not text:
        return {"success": False, "error": "maisaka.context.append needs segments with content (or visible_text)"}
    if problem := text_problem(text[:MAX_ENTRY_CHARS]):
        return {"success": False, "error": problem}
    text = text if len(text) <= MAX_ENTRY_CHARS else text[: MAX_ENTRY_CHARS - 1] + "…"
    if await db(lambda: session_of(stream_id)) is None:
        return {"success": False, "error": f"there is no chat with stream_id {stream_id}"}
    source_kind = str(args.get("source_kind") or f"plugin:{record.plugin_id}").strip()[:64]
    index = _add(stream_id, Entry(record.plugin_id, "context", text, time.monotonic()))
    return {"success": True, "index": index, "stream_id": stream_id, "visible_text": text, "source_kind": source_kind}


async def proactive_trigger(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.runtime import runtimes

    stream_id = stream_id_of(args, "stream_id", "chat_id", "session_id")
    intent = str(args.get("intent") or args.get("prompt") or args.get("text") or "").strip()
    reason = str(args.get("reason") or "").strip()
    if not stream_id:
        return {"success": False, "error": "maisaka.proactive.trigger needs stream_id"}
    if not intent:
        return {"success": False, "error": "maisaka.proactive.trigger needs intent"}
    if len(intent) > MAX_INTENT_CHARS or len(reason) > MAX_INTENT_CHARS:
        return {"success": False, "error": f"intent and reason are at most {MAX_INTENT_CHARS} characters each"}
    if problem := text_problem(intent):
        return {"success": False, "error": f"intent: {problem}"}

    def read() -> tuple[int, int] | None:
        session = session_of(stream_id)
        if session is None:
            return None
        last = session.messages.order_by("-pk").values_list("pk", flat=True).first()
        return session.pk, last or 0

    found = await db(read)
    if found is None:
        return {"success": False, "error": f"there is no chat with stream_id {stream_id}"}
    session_pk, last_pk = found
    text = intent + (f" (reason: {reason})" if reason else "")
    _add(stream_id, Entry(record.plugin_id, "proactive", text, time.monotonic()))
    if not runtimes.wake_or_start(session_pk, "proactive", last_seen_pk=last_pk):
        return {
            "success": False,
            "error": "no chat runtime runs in this process yet (it starts with the first inbound message); "
            "the request stays in the chat's next planner prompt",
        }
    return {"success": True, "accepted": True, "stream_id": stream_id, "intent": intent}
