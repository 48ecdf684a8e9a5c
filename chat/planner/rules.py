"""When the chat planner speaks: mentions of the bot, the group-chat bar, and plain model text that may
be sent as a reply (the rules are explained in chat/planner/__init__.py)."""

from __future__ import annotations

import math
import re

from chat.models import Message
from maibot.config import BotConfig, get_config

_AT_MENTION = re.compile(r"@<([^:<>]+):([^<>]*)>")


def bot_names(cfg: BotConfig) -> list[str]:
    return [n for n in {cfg.bot.nickname, *cfg.bot.alias_names} if n]


def mentions_bot(message: Message, cfg: BotConfig, bot_message_ids: set[str] = frozenset()) -> bool:
    """True when an inbound message addresses the bot (see chat/planner/__init__.py)."""
    names = [n.casefold() for n in bot_names(cfg)]
    text = (message.text or "").casefold()
    if any(name in text for name in names):
        return True
    own_id = getattr(message, "receiver_id", "") or ""  # the bot's account, when the adapter says so
    for nick, at_id in _AT_MENTION.findall(message.text or ""):
        if nick.strip().casefold() in names or (own_id and at_id.strip() == own_id):
            return True
    return bool(message.reply_to_platform_id and message.reply_to_platform_id in bot_message_ids)


def group_bar(talk_frequency: float, silent_streak: int) -> float:
    """How many unaddressed group messages it takes before the model is asked (inf: never)."""
    if talk_frequency <= 0:
        return math.inf
    return math.ceil(1 / talk_frequency) * 2 ** min(silent_streak, 4)


_MARKUP = re.compile(r"<\|?/?tool|\"(name|arguments|function)\"\s*:|^\s*(\{|\[|```)|\bno_reply\b", re.IGNORECASE)


def content_as_reply(content: str) -> str | None:
    """The model's plain text if it can be sent as a chat message as it is, else None."""
    text = (content or "").strip()
    if not text or len(text) > get_config().chat.max_reply_length or _MARKUP.search(text):
        return None
    return text
