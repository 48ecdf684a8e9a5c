"""When the chat planner speaks: mentions of the bot, the group-chat bar, and plain model text that may
be sent as a reply (the rules are explained in chat/planner/__init__.py)."""

from __future__ import annotations

import math
import re

from chat.models import Message
from core.config import BotConfig, get_config

_AT_MENTION = re.compile(r"@<([^:<>]+):([^<>]*)>")


def bot_names(cfg: BotConfig) -> list[str]:
    return [n for n in {cfg.bot.nickname, *cfg.bot.alias_names} if n]


def mentions_bot(
    message: Message, cfg: BotConfig, bot_message_ids: set[str] = frozenset(), bot_account: str = ""
) -> bool:
    """True when an inbound message addresses the bot (see chat/planner/__init__.py). `bot_account`: the
    bot's own account on the message's platform (chat.accounts.bot_account)."""
    if (message.extra or {}).get("mentioned") is True:  # the adapter (plugin) said so (chat.ingest)
        return True
    names = [n.casefold() for n in bot_names(cfg)]
    text = (message.text or "").casefold()
    if any(name in text for name in names):
        return True
    # The bot's account: configured or learned, and the one this message's receiver_info names.
    own_ids = {i for i in (bot_account, getattr(message, "receiver_id", "") or "") if i}
    for nick, at_id in _AT_MENTION.findall(message.text or ""):
        if nick.strip().casefold() in names or at_id.strip() in own_ids:
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
