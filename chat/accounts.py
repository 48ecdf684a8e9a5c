"""The bot's own account on each platform: `bot.platform_accounts` in the config, else what the adapter
told us (an inbound message's `receiver_info`, kept in AdapterPlatform.bot_account).

Group messages go out as that account (user_info), and `@<any name:that id>` mentions the bot. Reads are
cached per process for LEARNED_TTL seconds, so the outbox and the planner do not query per message; a
newly learned account reaches other processes within that time.
"""

from __future__ import annotations

import logging
import threading
import time

from chat.models import AdapterPlatform
from core.config import get_config

logger = logging.getLogger(__name__)

LEARNED_TTL = 60.0

_lock = threading.Lock()
_learned: dict[str, tuple[str, float]] = {}  # platform -> (account, monotonic time read)


def bot_account(platform: str) -> str:
    """The bot's account id on `platform`, or "" when neither the config nor the adapter names it.
    Sync (may read the database): call it from sync code or a worker thread."""
    configured = get_config().bot.platform_accounts.get(platform)
    if configured:
        return configured
    now = time.monotonic()
    with _lock:
        cached = _learned.get(platform)
    if cached is not None and now - cached[1] < LEARNED_TTL:
        return cached[0]
    account = AdapterPlatform.objects.filter(platform=platform).values_list("bot_account", flat=True).first() or ""
    with _lock:
        _learned[platform] = (account, now)
    return account


def bot_account_learn(platform: str, account: str) -> None:
    """Record the account the adapter names as the bot's (written only when it changes)."""
    account = (account or "").strip()[:128]
    if not account or not platform:
        return
    with _lock:
        cached = _learned.get(platform)
    if cached is not None and cached[0] == account:
        return
    AdapterPlatform.objects.update_or_create(platform=platform, defaults={"bot_account": account})
    with _lock:
        _learned[platform] = (account, time.monotonic())
    configured = get_config().bot.platform_accounts.get(platform)
    if configured and configured != account:
        logger.warning(
            "the %s adapter says the bot is account %s, but bot.platform_accounts says %s (the config wins)",
            platform,
            account,
            configured,
        )
    else:
        logger.info("the bot's %s account is %s (told by the adapter)", platform, account)


def forget_cached_accounts() -> None:
    """Drop the per-process cache of learned accounts (between tests)."""
    with _lock:
        _learned.clear()
