"""The chat planner's prompts: the registered system and turn Prompts, and the rendering of the chat
history and of the previous cycles' records they show."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from chat.agent.prompt import prompt_manager
from chat.models import ChatSession, Direction, PlannerCycle, SourceKind
from core.config import BotConfig


class HistoryLine(NamedTuple):
    """The fields of a message the prompt shows (a full Message costs ~4× as much to load)."""

    pk: int
    direction: str
    source_kind: str
    platform_message_id: str
    sender_id: str
    sender_nickname: str
    sender_cardname: str
    text: str
    reply_to_platform_id: str
    time: datetime


SYSTEM_PROMPT = "planner.system"
TURN_PROMPT = "planner.turn"

TOOL_GUIDANCE = """\
How you act: you only act through tools.
- To say something, call `reply` (one message; quote a message by its #id only when it helps).
- To stay silent, call `no_reply` with a short reason. Do not talk just to fill silence; in group
  chats speak when addressed or when you really have something to add, and never twice in a row.
- `send_emoji` sends a sticker when one fits better than words (only offered when stickers exist).
- Other tools may be offered; use them when they help. Each turn ends with reply, send_emoji or
  no_reply."""

SCHEDULING_GUIDANCE = """\
Reminders and promised follow-ups: use `schedule_private_message` (the text you write is sent as is
at that time, with no further thought), `list_scheduled_private_messages` and
`cancel_scheduled_private_message`. Compute send_at from the current time below and give it as
ISO 8601 with the offset. Then confirm to the person with `reply`."""

prompt_manager.add_system_prompt(
    SYSTEM_PROMPT,
    [
        ("persona", "{persona}"),
        ("identity", "Your name is {nickname}.{aliases} {chat_description}"),
        ("tool_guidance", TOOL_GUIDANCE),
        ("scheduling_guidance", "{scheduling_guidance}"),
    ],
    construct={
        "scheduling_guidance": lambda c: SCHEDULING_GUIDANCE if c["private"] else "",
        "aliases": lambda c: f" People also call you {', '.join(c['alias_names'])}." if c["alias_names"] else "",
    },
)
prompt_manager.add_system_prompt(
    TURN_PROMPT,
    [
        ("context_blocks", "{context_blocks}"),
        ("cycle_records", "{cycle_records}"),
        ("history", "{history}"),
        ("now", "Current time: {now}"),
        ("instruction", "{instruction}"),
    ],
    construct={
        "context_blocks": lambda c: "\n\n".join(f"## {name}\n{text}" for name, text in c["blocks"]),
        "cycle_records": lambda c: _render_cycle_records(c["cycles"], c["tz"]),
        "history": lambda c: _render_history(c["history"], c["new_ids"], c["cfg"], c.get("rendered")),
    },
)


def _speaker(message: HistoryLine, cfg: BotConfig) -> str:
    if message.direction == Direction.OUT:
        marks = {
            SourceKind.REPLY: "you",
            SourceKind.SCHEDULED_SEND: "you, scheduled message",
            SourceKind.TIMER: "you, on your own",
            SourceKind.PROACTIVE: "you, proactive message",
            SourceKind.ADMIN: "sent in your name by the operator",
        }
        return f"{cfg.bot.nickname} ({marks.get(message.source_kind, 'you')})"
    return message.sender_cardname or message.sender_nickname or message.sender_id or "someone"


def render_history_line(m: HistoryLine, cfg: BotConfig, tz) -> str:
    ref = f"#{m.platform_message_id} " if m.platform_message_id else ""
    quote = f" (quoting #{m.reply_to_platform_id})" if m.reply_to_platform_id else ""
    text = (m.text or "").replace("\n", "\n    ")
    return f"{ref}[{m.time.astimezone(tz):%m-%d %H:%M:%S}] {_speaker(m, cfg)}{quote}: {text}"


def _render_history(history: list[HistoryLine], new_ids: set[int], cfg: BotConfig, rendered=None) -> str:
    if not history:
        return "Chat history: (empty)"
    tz = cfg.tzinfo
    lines = ["Chat history (oldest first):"]
    marked = False
    for m in history:
        if m.pk in new_ids and not marked:
            lines.append("--- new since your last turn ---")
            marked = True
        lines.append(rendered(m) if rendered else render_history_line(m, cfg, tz))
    return "\n".join(lines)


def _render_cycle_records(cycles: list[PlannerCycle], tz) -> str:
    if not cycles:
        return ""
    lines = ["Your last turns (oldest first):"]
    for c in cycles:
        parts = [f"[{c.started_at.astimezone(tz):%m-%d %H:%M}] {c.action or '?'}"]
        if c.reasoning:
            parts.append(f"why: {c.reasoning[:200]}")
        if c.outcome:
            parts.append(f"outcome: {c.outcome[:200]}")
        if c.error:
            parts.append(f"error: {c.error[:120]}")
        lines.append(" — ".join(parts))
    return "\n".join(lines)


def chat_description(session: ChatSession) -> str:
    if session.is_private:
        who = session.user_cardname or session.user_nickname or session.user_id
        return f"You are in a private chat with {who} on {session.platform}."
    return f"You are in the group chat {session.group_name or session.group_id} on {session.platform}."


def instruction(trigger: str, *, private: bool, mentioned: bool) -> str:
    if trigger == "proactive":
        return (
            "Nobody wrote: a plugin asked you to take a turn in this chat (see its request above). Act on it "
            "if it fits the chat and your persona, then reply; otherwise call no_reply."
        )
    if trigger == "no_reply_timeout":
        return (
            "Nobody has written since you chose to stay silent. Follow up once if it is natural, "
            "otherwise call no_reply."
        )
    if private:
        return "Decide what to do about the new messages: act with the tools, then reply or no_reply."
    if mentioned:
        return "You were mentioned in the new messages: answer with reply (or no_reply if nothing fits)."
    return "Nobody addressed you. Speak only if you have something worth adding; otherwise call no_reply."
