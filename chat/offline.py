"""The OFFLINE planner: used only when no model is configured; it answers what registered commands understand.

It never runs when a model is configured (`get_config().offline` is False). Each typed text of the new
messages is offered to the commands in chat.components (scheduling registers the reminder commands:
"remind me in 10 minutes…", "提醒我10分钟后喝水", /schedule, /list, /cancel); the first that handles it
answers. When none did, a fixed answer in the bot's language (bot.language zh or en) says no model is
configured, with what the commands can do. In group chats it answers only commands and messages that
mention the bot. Every answered turn is a PlannerCycle with action offline_* and no LLM call; the
commands' tool calls are recorded on it. Messages without text (images, stickers, notices) get no answer.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.components import ToolContext, commands, registry
from chat.models import ChatSession, CycleKind, Message, PlannerCycle, SourceKind, ToolCallRecord
from chat.services import message_send
from maibot.config import get_config

NOTICE = {
    "zh": ("（离线模式：还没有配置模型，", "我什么也做不了。）"),
    "en": ("(Offline mode: no model is configured, ", "so I cannot answer.)"),
}


def _notice() -> str:
    lang = get_config().bot.language.split("-")[0]
    lang = lang if lang in NOTICE else "en"
    head, nothing = NOTICE[lang]
    helps = [c.help.get(lang) or c.help.get("en", "") for c in commands() if c.help]
    return head + (helps[0] if helps else nothing)


class _Turn:
    """One offline turn: what was done, for the reply and the cycle record (a chat.components.CommandTurn)."""

    def __init__(self, session: ChatSession, cycle: PlannerCycle) -> None:
        self.session = session
        self.cycle = cycle
        self.actions: list[str] = []
        self.replies: list[str] = []
        self.round = 0

    def answer(self, text: str, action: str) -> None:
        self.replies.append(text)
        self.actions.append(action)

    def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        call_id = f"offline_{uuid.uuid4().hex[:16]}"
        ctx = ToolContext(session=self.session, tool_call_id=call_id, cycle=self.cycle)
        result = registry.get(name)(ctx, **arguments)
        ToolCallRecord.objects.create(
            cycle=self.cycle,
            round=self.round,
            tool_call_id=call_id,
            name=name,
            arguments=arguments,
            result=result,
            ok=bool(result.get("ok")),
        )
        self.round += 1
        return result


def _typed_text(message: Message) -> str:
    """What the person typed: the text segments only (an image's "[image]" placeholder is not)."""

    def walk(segments) -> str:
        out = []
        for seg in segments or []:
            if seg.get("type") == "text" and isinstance(seg.get("data"), str):
                out.append(seg["data"])
            elif seg.get("type") == "seglist" and isinstance(seg.get("data"), list):
                out.append(walk(seg["data"]))
        return "".join(out)

    return walk(message.segments).strip()


def offline_turn(*, session: ChatSession, new_messages: list[Message], mentioned: bool) -> PlannerCycle | None:
    """Handle the new messages of one cycle; None when there was nothing to answer (group chatter)."""
    started = time.perf_counter()
    texts = [t for t in (_typed_text(m) for m in new_messages) if t]
    slash = [t for t in texts if t.startswith("/")]
    if not texts:
        return None  # stickers, images, notices: nothing to read, nothing to answer
    if not session.is_private and not (mentioned or slash):
        return None
    now = timezone.now()
    cycle = PlannerCycle.objects.create(
        session=session, kind=CycleKind.CHAT, started_at=now, trigger=f"{len(new_messages)} new message(s), offline"
    )
    turn = _Turn(session, cycle)
    handlers = commands()
    for text in texts:
        for command in handlers:
            if command.handle(turn, text):
                break
    if not turn.replies:
        turn.answer(_notice(), "offline_notice")
    for text in turn.replies:
        message_send(session=session, source_kind=SourceKind.REPLY, text=text, extra={"cycle_id": str(cycle.cycle_id)})
    cycle.action = turn.actions[0]
    cycle.reasoning = "offline planner (no model configured)"
    cycle.outcome = "; ".join(f"{a}: {r}" for a, r in zip(turn.actions, turn.replies, strict=False))[:4000]
    cycle.ended_at = timezone.now()
    cycle.timings = {"total_ms": round((time.perf_counter() - started) * 1000, 3)}
    cycle.save(update_fields=["action", "reasoning", "outcome", "ended_at", "timings"])
    return cycle


async def run_offline_cycle(
    *, session: ChatSession, new_messages: list[Message], mentioned: bool
) -> PlannerCycle | None:
    return await sync_to_async(offline_turn)(session=session, new_messages=new_messages, mentioned=mentioned)
