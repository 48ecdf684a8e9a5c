"""Talk control: how readily the bot speaks in a chat right now (chat.talk_frequency and its rules per
chat and time of day), whose messages are never planned (ignore lists), and who may use commands.

Chats are named `platform:group:ID` or `platform:private:ID`, people `platform:USER_ID`, as in the
config. Everything is read from get_config() on each use, so an edit applies at once. `clock` is the
one source of "now" here (tests inject theirs).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

from chat.models import ChatSession, Message
from core.config import BotConfig, TalkRule, get_config

clock: Callable[[], datetime] = timezone.now
MAX_ADJUSTED = 10_000  # chats whose talk frequency a plugin may adjust at once

_adjust_lock = threading.Lock()
_adjust: dict[str, float] = {}  # session_id → factor (frequency.set_adjust)


def chat_key(session: ChatSession) -> str:
    return f"{session.platform}:{session.chat_type}:{session.target_id}"


def person_key(platform: str, user_id: str) -> str:
    return f"{platform}:{user_id}"


def _minutes(hhmm: str) -> int:
    hours, minutes = hhmm.split(":")
    return int(hours) * 60 + int(minutes)


def _in_window(rule: TalkRule, minute_of_day: int) -> bool:
    start, end = _minutes(rule.start), _minutes(rule.end)
    if start == end:
        return True  # all day
    if start < end:
        return start <= minute_of_day < end
    return minute_of_day >= start or minute_of_day < end  # across midnight, e.g. 22:00-06:00


def talk_adjust(session_id: str) -> float:
    """The factor a plugin set for this chat's talk_frequency (frequency.set_adjust); 1.0 when none."""
    with _adjust_lock:
        return _adjust.get(session_id, 1.0)


def talk_adjust_set(session_id: str, factor: float) -> None:
    """Multiply this chat's talk_frequency by `factor` (≥ 0; 1.0 removes the adjustment). Kept in this
    process, as MaiBot keeps it on the chat's runtime: a restart forgets it."""
    if not math.isfinite(factor) or factor < 0:
        raise ValueError(f"the talk frequency factor must be a finite number ≥ 0, not {factor!r}")
    with _adjust_lock:
        if factor == 1.0:
            _adjust.pop(session_id, None)
        elif session_id in _adjust or len(_adjust) < MAX_ADJUSTED:
            _adjust[session_id] = factor
        else:
            raise ValueError(f"{MAX_ADJUSTED} chats already have an adjusted talk frequency")


def talk_frequency(session: ChatSession, *, cfg: BotConfig | None = None, now: datetime | None = None) -> float:
    """The talk_frequency in force for `session` now, times the chat's adjustment (talk_adjust)."""
    return _configured_frequency(session, cfg=cfg, now=now) * talk_adjust(session.session_id)


def _configured_frequency(session: ChatSession, *, cfg: BotConfig | None, now: datetime | None) -> float:
    """A rule for this chat whose window holds beats a rule for every chat; among equals the first
    listed; no rule: chat.talk_frequency."""
    cfg = cfg or get_config()
    rules = cfg.chat.talk_frequency_rules
    if not rules:
        return cfg.chat.talk_frequency
    local = (now or clock()).astimezone(cfg.tzinfo)
    minute = local.hour * 60 + local.minute
    key = chat_key(session)
    for wanted in (key, ""):
        for rule in rules:
            if rule.chat == wanted and _in_window(rule, minute):
                return rule.talk_frequency
    return cfg.chat.talk_frequency


def is_command(text: str) -> bool:
    return text.lstrip().startswith("/")


def may_command(message: Message, session: ChatSession, cfg: BotConfig | None = None) -> bool:
    """Whether the sender of `message` may use commands (everyone, unless chat.command_operators lists some)."""
    operators = (cfg or get_config()).chat.command_operators
    return not operators or person_key(session.platform, message.sender_id) in operators


def plannable(
    messages: list[Message], session: ChatSession, cfg: BotConfig | None = None
) -> tuple[list[Message], list[Message]]:
    """Split new messages into those the planner may see and those it never does (stored all the same):
    everything in an ignored chat, an ignored person's messages, and commands (text starting with "/")
    of people who may not use them."""
    cfg = cfg or get_config()
    chat = cfg.chat
    if not (chat.ignored_chats or chat.ignored_users or chat.command_operators):
        return messages, []
    if chat_key(session) in chat.ignored_chats:
        return [], messages
    kept, dropped = [], []
    for m in messages:
        ignored = person_key(session.platform, m.sender_id) in chat.ignored_users
        forbidden = is_command(m.text or "") and not may_command(m, session, cfg)
        (dropped if ignored or forbidden else kept).append(m)
    return kept, dropped
