"""Who may connect as an adapter: the platform header, the token (MAIBOT_ADAPTER_TOKENS), loopback only
when no tokens are configured."""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings

from chat.outbox import WEB_PLATFORM


def _is_loopback(host: str | None) -> bool:
    try:
        return ipaddress.ip_address((host or "").strip("[]")).is_loopback
    except ValueError:
        return False


def adapter_auth_problem(*, platform: str | None, token: str | None, client_host: str | None) -> str | None:
    """Why an adapter may not connect, or None. Tokens from MAIBOT_ADAPTER_TOKENS; none → loopback only."""
    if not platform:
        return "missing `platform` header"
    if platform == WEB_PLATFORM:
        return "platform `web` is reserved for the browser chat page"
    tokens = settings.MAIBOT_ADAPTER_TOKENS
    if tokens:
        given = (token or "").strip()
        if given.lower().startswith("bearer "):
            given = given[7:].strip()
        if not given or not any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens):
            return "invalid or missing token"
        return None
    if not _is_loopback(client_host):
        return "no adapter tokens configured: only loopback adapters are accepted"
    return None
