"""Who a request comes from: the one place that decides a request's client address (and scheme).

The client is the peer that opened the connection, unless that peer is a trusted proxy
(MAIBOT_TRUSTED_PROXIES): then it is the right-most X-Forwarded-For entry that is not itself a trusted
proxy, and X-Forwarded-Proto says whether the client used https. Entries to the left of that one were
written by the client (or by proxies nobody vouches for) and are never believed; from a peer that is not
a trusted proxy the headers are ignored altogether. `ForwardedClientMiddleware`, the outermost layer of
the ASGI application (maibot.asgi), rewrites the scope's `client` and `scheme` for HTTP and websockets,
so everything downstream sees one address: Django's REMOTE_ADDR and `request.is_secure()`, the adapter
gateway (python-socketio builds its environ from the scope), loopback admission,
MAIBOT_ADAPTER_ALLOW_FROM, refusal logs and the set-up page's attempt limits.

Without trusted proxies nothing is rewritten. A proxy on the same host that is not configured makes
every client look like that proxy (loopback); whatever decides by address must stay safe then.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from django.conf import settings

from core.networks import Network, address_in

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

FORWARDED_FOR = b"x-forwarded-for"
FORWARDED_PROTO = b"x-forwarded-proto"
# A chain longer than this is not a deployment's proxies but a client padding the header.
MAX_HOPS = 32


def _hop_address(entry: str) -> str | None:
    """The address of one X-Forwarded-For entry (`203.0.113.5`, `203.0.113.5:4711`, `[2001:db8::1]:443`,
    `2001:db8::1`), normalised (an IPv4-mapped IPv6 address as its IPv4 address); None if it is none."""
    entry = entry.strip().strip('"')
    if entry.startswith("["):
        entry = entry[1:].partition("]")[0]
    elif entry.count(":") == 1:
        entry = entry.partition(":")[0]
    try:
        address = ipaddress.ip_address(entry)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def forwarded_client(peer: str | None, forwarded_for: Iterable[str], trusted: tuple[Network, ...]) -> str | None:
    """The client address of a request from `peer` carrying these X-Forwarded-For values (each header
    line, in order). Not a trusted proxy: the peer. A trusted proxy: walking the entries from the right,
    the first one that is not a trusted proxy; when every entry is one, the left-most; with no entries,
    the peer itself (a request the proxy made, or one sent to the server directly from its host). None
    when the entry that decides is not an address (the client is then unknown, never the proxy)."""
    if not address_in(peer, trusted):
        return peer
    entries = [part for line in forwarded_for for part in line.split(",") if part.strip()]
    if not entries:
        return peer
    if len(entries) > MAX_HOPS:
        entries = entries[-MAX_HOPS:]
    for entry in reversed(entries):
        address = _hop_address(entry)
        if address is None:
            return None
        if not address_in(address, trusted):
            return address
    return _hop_address(entries[0])


def _forwarded_scheme(kind: str, values: list[str], current: str | None) -> str | None:
    """The scheme the client used, from X-Forwarded-Proto (the nearest proxy's value: the last one)."""
    parts = [part.strip().lower() for line in values for part in line.split(",") if part.strip()]
    if not parts or parts[-1] not in ("http", "https"):
        return current
    secure = parts[-1] == "https"
    if kind == "websocket":
        return "wss" if secure else "ws"
    return "https" if secure else "http"


class ForwardedClientMiddleware:
    """ASGI middleware: the scope's `client` (and `scheme`) as the trusted proxies forwarded them
    (see the module). Reads settings.MAIBOT_TRUSTED_PROXIES on each connection; with none configured
    the scope passes untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive, send) -> None:
        trusted = settings.MAIBOT_TRUSTED_PROXIES
        if trusted and scope["type"] in ("http", "websocket"):
            scope = self.rewrite(scope, trusted)
        await self.app(scope, receive, send)

    @staticmethod
    def rewrite(scope: Scope, trusted: tuple[Network, ...]) -> Scope:
        peer = (scope.get("client") or (None, 0))[0]
        if not address_in(peer, trusted):
            return scope
        forwarded_for, forwarded_proto = [], []
        for name, value in scope.get("headers") or ():
            name = name.lower()
            if name == FORWARDED_FOR:
                forwarded_for.append(value.decode("latin-1"))
            elif name == FORWARDED_PROTO:
                forwarded_proto.append(value.decode("latin-1"))
        scope = {**scope, "scheme": _forwarded_scheme(scope["type"], forwarded_proto, scope.get("scheme"))}
        if forwarded_for:
            client = forwarded_client(peer, forwarded_for, trusted)
            # The client's own port is not forwarded: 0 stands for "unknown".
            scope["client"] = None if client is None else (client, 0)
        return scope
