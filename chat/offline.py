"""The OFFLINE planner: used only when no model is configured; understands a few fixed requests.

It never runs when a model is configured (`get_config().offline` is False). In a private chat it
understands, in English and Chinese (times as scheduling.timespec.split_spoken_time reads them):

    remind me in 10 minutes to drink water      remind me at 8:30 to call mom
    remind me tomorrow at 8 to ...              remind me to drink water in 10 minutes
    提醒我10分钟后喝水                            10分钟后提醒我喝水
    明天早上8点提醒我开会                          下午3点半提醒我…
    /schedule <time> <text>   (time: ISO 8601, "in 10 minutes", "at 8:30", "10分钟后", "明天8点")
    /list                     (pending scheduled messages of this chat)
    /cancel <id>              (/cancel all cancels every pending one)

A reminder is scheduled through the same tool the model would call (so it is recorded as a tool call
and the ScheduledMessage links to it) and confirmed with a reply; at its time the dispatcher sends
"⏰ <text>" with no further thought. Anything else gets a fixed answer, in the bot's language
(bot.language zh or en), saying no model is configured. In group chats it answers only commands and
messages that mention the bot. Every answered turn is a PlannerCycle with action offline_* and no
LLM call. Messages without text (images, stickers, notices) get no answer.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.models import ChatSession, CycleKind, Message, PlannerCycle, SourceKind, ToolCallRecord
from chat.services import message_send
from chat.tools import ToolContext, registry
from maibot.config import get_config
from scheduling.timespec import TimeSpecError, split_spoken_time

TEXTS = {
    "zh": {
        "offline": "（离线模式：还没有配置模型，我只能帮你设提醒。）试试“提醒我10分钟后喝水”、"
        "“/schedule 明天8点 开会”、“/list” 或 “/cancel <编号>”。",
        "scheduled": "好的，{when} 提醒你：{text}（编号 {id}）",
        "reminder": "⏰ {text}",
        "none": "现在没有待发送的提醒。",
        "list_head": "待发送的提醒：",
        "cancelled": "已取消：{ids}",
        "error": "没办法：{message}",
        "bad_time": "没看懂时间：{message}",
        "usage_schedule": "用法：/schedule <时间> <内容>，例如 /schedule 10分钟后 喝水",
        "usage_cancel": "用法：/cancel <编号>，或 /cancel all",
        "empty_text": "要提醒什么呢？",
    },
    "en": {
        "offline": "(Offline mode: no model is configured, so I can only set reminders.) Try "
        '"remind me in 10 minutes to drink water", "/schedule tomorrow at 8 meeting", "/list" or "/cancel <id>".',
        "scheduled": "OK, I'll remind you at {when}: {text} (id {id})",
        "reminder": "⏰ {text}",
        "none": "No pending reminders.",
        "list_head": "Pending reminders:",
        "cancelled": "Cancelled: {ids}",
        "error": "Sorry: {message}",
        "bad_time": "I could not read the time: {message}",
        "usage_schedule": "Usage: /schedule <time> <text>, e.g. /schedule in 10 minutes drink water",
        "usage_cancel": "Usage: /cancel <id>, or /cancel all",
        "empty_text": "Remind you of what?",
    },
}


def _t(key: str, **kw: Any) -> str:
    lang = get_config().bot.language.split("-")[0]
    return TEXTS.get(lang, TEXTS["en"])[key].format(**kw)


_EN_REMIND = re.compile(r"^(?:please\s+)?remind\s+me\s+(?P<rest>.+)$", re.I | re.S)
_EN_TO_LAST = re.compile(r"^to\s+(?P<what>.+?)\s+(?P<when>(?:in|at|tomorrow|today)\s+.+)$", re.I | re.S)
_ZH_REMIND_FIRST = re.compile(r"^(?:请)?(?:你)?提醒我\s*(?:在)?\s*(?P<rest>.+)$", re.S)
_ZH_REMIND_AFTER = re.compile(r"^(?:请)?(?:在)?\s*(?P<when>.+?)\s*(?:的时候)?\s*(?:请)?提醒我\s*(?P<what>.*)$", re.S)


class _Turn:
    """One offline turn: what was done, for the reply and the cycle record."""

    def __init__(self, session: ChatSession, cycle: PlannerCycle) -> None:
        self.session = session
        self.cycle = cycle
        self.actions: list[str] = []
        self.replies: list[str] = []
        self.round = 0

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


def _now_local_text(iso: str) -> str:
    return iso.replace("T", " ")[:19]


def _schedule(turn: _Turn, when_text: str, what: str, *, now) -> None:
    cfg = get_config()
    try:
        found = split_spoken_time(when_text, cfg.tzinfo, now=now)
    except TimeSpecError as exc:
        turn.replies.append(_t("bad_time", message=str(exc)))
        turn.actions.append("offline_error")
        return
    if found is None:
        turn.replies.append(_t("bad_time", message=when_text))
        turn.actions.append("offline_error")
        return
    send_at, leftover = found
    what = " ".join(p for p in (leftover, what) if p).strip()
    what = re.sub(r"^(?:to|要|去)\s*", "", what, flags=re.I).strip(" ，,。.")
    if not what:
        turn.replies.append(_t("empty_text"))
        turn.actions.append("offline_error")
        return
    result = turn.tool("schedule_private_message", send_at=send_at.isoformat(), message_text=_t("reminder", text=what))
    if result.get("ok"):
        turn.replies.append(_t("scheduled", when=_now_local_text(result["send_at"]), text=what, id=result["task_id"]))
        turn.actions.append("offline_schedule")
    else:
        turn.replies.append(_t("error", message=result["error"]["message"]))
        turn.actions.append("offline_error")


def _command(turn: _Turn, text: str, *, now) -> bool:
    name, _, args = text[1:].partition(" ")
    name, args = name.lower(), args.strip()
    if name == "schedule":
        if not args:
            turn.replies.append(_t("usage_schedule"))
            turn.actions.append("offline_error")
        else:
            _schedule(turn, args, "", now=now)
        return True
    if name == "list":
        result = turn.tool("list_scheduled_private_messages")
        if not result.get("ok"):
            turn.replies.append(_t("error", message=result["error"]["message"]))
        elif not result["tasks"]:
            turn.replies.append(_t("none"))
        else:
            lines = [_t("list_head")]
            lines += [f"{t['task_id']}  {_now_local_text(t['send_at'])}  {t['message_text']}" for t in result["tasks"]]
            turn.replies.append("\n".join(lines))
        turn.actions.append("offline_list")
        return True
    if name == "cancel":
        if not args:
            turn.replies.append(_t("usage_cancel"))
            turn.actions.append("offline_error")
            return True
        task_id = None if args.lower() in {"all", "全部"} else args.split()[0]
        result = turn.tool("cancel_scheduled_private_message", task_id=task_id)
        if result.get("ok"):
            turn.replies.append(_t("cancelled", ids=", ".join(result["cancelled_task_ids"]) or "-"))
            turn.actions.append("offline_cancel")
        else:
            turn.replies.append(_t("error", message=result["error"]["message"]))
            turn.actions.append("offline_error")
        return True
    return False


def _request(turn: _Turn, text: str, *, now) -> bool:
    """A reminder request in words; True when the text was one (handled, well or with an error)."""
    if m := _EN_REMIND.match(text):
        rest = m.group("rest").strip()
        if last := _EN_TO_LAST.match(rest):
            _schedule(turn, last.group("when"), last.group("what"), now=now)
        else:
            _schedule(turn, rest, "", now=now)
        return True
    if m := _ZH_REMIND_FIRST.match(text):
        _schedule(turn, m.group("rest"), "", now=now)
        return True
    if (m := _ZH_REMIND_AFTER.match(text)) and m.group("when"):
        _schedule(turn, m.group("when"), m.group("what"), now=now)
        return True
    return False


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
    commands = [t for t in texts if t.startswith("/")]
    if not texts:
        return None  # stickers, images, notices: nothing to read, nothing to answer
    if not session.is_private and not (mentioned or commands):
        return None
    now = timezone.now()
    cycle = PlannerCycle.objects.create(
        session=session, kind=CycleKind.CHAT, started_at=now, trigger=f"{len(new_messages)} new message(s), offline"
    )
    turn = _Turn(session, cycle)
    for text in texts:
        if not session.is_private:
            if text.startswith("/"):
                turn.replies.append(_t("error", message="scheduled messages are for private chats only"))
                turn.actions.append("offline_error")
            continue
        if text.startswith("/") and _command(turn, text, now=now):
            continue
        _request(turn, text, now=now)
    if not turn.replies:
        turn.replies.append(_t("offline"))
        turn.actions.append("offline_notice")
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
