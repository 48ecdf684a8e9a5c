"""Who may connect as an adapter, and what it said about itself when it connected.

Two ways an adapter introduces itself on /ws (both wire versions):
- legacy mode (maim_message's Router): `platform` header, the raw token in `Authorization`;
- API-Server mode (maim_message ≥ 0.6.x's WebSocketClient, MaiBot-Napcat-Adapter's
  `enable_api_server = true`): `x-platform`, the key in `x-apikey` (and a connection id in `x-uuid`);
  its frames are APIMessageBase packages (chat.wire.inbound / chat.wire.outbound).

The rules: each token in MAIBOT_ADAPTER_TOKENS is bound to one platform (core.adapter_tokens), and
admits its holder as that platform only: the token (or key) sent must be one bound to the platform the
adapter claims (compared in constant time with every configured token). An adapter that sends none is
admitted from a network in MAIBOT_ADAPTER_ALLOW_FROM (legacy adapters that cannot send a token), and
only for a platform that has no token: a platform with a token is reachable with it alone. With no
tokens configured, loopback and the ALLOW_FROM networks are admitted, as any platform. A wrong token
is refused wherever it comes from. So a connection's platform is its identity: only a holder of
platform X's token (or, for a platform without one, an admitted address) can be X, receive X's
messages, send as X, echo X's deliveries or replace X's connection (chat.gateway.connections).
Refusals are logged once per address and reason per minute (RefusalLog): a refused adapter retries
every few seconds.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from django.conf import settings

from chat.outbox_rows import WEB_PLATFORM
from core import deployment_env
from core.adapter_tokens import AdapterToken
from core.networks import address_in

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterHello:
    """What an adapter's connect request says: its platform (the routing key), its token, its mode."""

    platform: str
    token: str | None
    # maim_message's API-Server mode: x-apikey / x-platform headers, APIMessageBase packages.
    api_server: bool


def adapter_hello(headers: Mapping[str, str]) -> AdapterHello:
    """The adapter's introduction from its request headers (names lower-case, hyphenated)."""
    if "x-apikey" in headers or "x-platform" in headers:
        return AdapterHello(
            platform=(headers.get("x-platform") or "").strip(), token=headers.get("x-apikey"), api_server=True
        )
    return AdapterHello(
        platform=(headers.get("platform") or "").strip(), token=headers.get("authorization"), api_server=False
    )


def environ_headers(environ: Mapping[str, object]) -> dict[str, str]:
    """Request headers from a WSGI-style environ (python-socketio's): HTTP_X_APIKEY → x-apikey."""
    return {
        key[5:].lower().replace("_", "-"): value
        for key, value in environ.items()
        if key.startswith("HTTP_") and isinstance(value, str)
    }


def _is_loopback(host: str | None) -> bool:
    try:
        address = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _token_platforms(given: str, tokens: Collection[AdapterToken]) -> set[str]:
    """The platforms `given` is a token of. Every configured token is compared, so the time taken says
    nothing about which one nearly matched."""
    platforms = set()
    for token in tokens:
        if hmac.compare_digest(given.encode(), token.secret.encode()):
            platforms.add(token.platform)
    return platforms


def adapter_auth_problem(
    *, platform: str | None, token: str | None, client_host: str | None, api_server: bool = False
) -> str | None:
    """Why an adapter may not connect, or None (see the module's rules)."""
    if not platform:
        return "missing `x-platform` header" if api_server else "missing `platform` header"
    if platform == WEB_PLATFORM:
        return "platform `web` is reserved for the browser chat page"
    given = (token or "").strip()
    if given.lower().startswith("bearer "):
        given = given[7:].strip()
    allowed = address_in(client_host, settings.MAIBOT_ADAPTER_ALLOW_FROM)
    deployment_env.refresh()  # tokens changed in the console apply to the next connection
    tokens: tuple[AdapterToken, ...] = settings.MAIBOT_ADAPTER_TOKENS
    if tokens:
        if given:
            platforms = _token_platforms(given, tokens)
            if platform in platforms:
                return None
            if platforms:
                return f"the token is bound to platform {', '.join(sorted(platforms))}, not {platform!r}"
            return "invalid token"
        if any(token.platform == platform for token in tokens):
            return f"missing token (platform {platform!r} has one in MAIBOT_ADAPTER_TOKENS: its adapter must send it)"
        if allowed:
            return None
        return "missing token (and the address is not in MAIBOT_ADAPTER_ALLOW_FROM)"
    if _is_loopback(client_host) or allowed:
        return None
    return "no adapter tokens configured: only loopback adapters and MAIBOT_ADAPTER_ALLOW_FROM are accepted"


class RefusalLog:
    """Logs each refused connection once per (address, reason) per `window` seconds, however often the
    adapter retries; the next line says how many were not logged meanwhile. At most `max_keys` pairs are
    remembered (the least recently refused is forgotten first), so a scan from many addresses costs
    bounded memory, never more than one line per pair and window."""

    def __init__(
        self, *, window: float = 60.0, max_keys: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window, self.max_keys, self.clock = window, max_keys, clock
        # (address, reason) → [when it was last logged, refusals not logged since]
        self._seen: OrderedDict[tuple[str, str], list[float | int]] = OrderedDict()

    def refused(self, *, address: str, reason: str, platform: str, mode: str) -> bool:
        """Record a refusal; log it unless this pair was logged within the window. True when logged."""
        key = (address, reason)
        now = self.clock()
        entry = self._seen.get(key)
        if entry is not None:
            self._seen.move_to_end(key)
            if now - entry[0] < self.window:
                entry[1] += 1
                return False
            suppressed = int(entry[1])
            entry[0], entry[1] = now, 0
        else:
            suppressed = 0
            self._seen[key] = [now, 0]
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        logger.warning(
            "%s adapter connection from %s (platform %r) refused: %s%s", mode, address, platform, reason, more
        )
        return True

    def __len__(self) -> int:
        return len(self._seen)


refusal_log = RefusalLog()
