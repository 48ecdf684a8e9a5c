"""The project's front ASGI app: /ws to the adapter gateway (Socket.IO or the plain websocket), everything
else to Django."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from chat.gateway.daphne_patch import allow_protocol_close_codes
from chat.gateway.gateway import get_gateway
from chat.gateway.mm06 import plain_adapter_app

logger = logging.getLogger(__name__)

ADAPTER_PATHS = ("/ws", "/ws/")


class GatewayRouter:
    """Front ASGI app: /ws goes to the adapter gateway (Socket.IO when the query carries EIO=, including
    its HTTP long-polling requests; the plain websocket otherwise); the mounted HTTP apps (the MCP
    endpoint) on their paths; everything else to Django."""

    def __init__(self, *, http, websocket, http_mounts: dict[tuple[str, ...], Any] | None = None) -> None:
        self.http, self.websocket = http, websocket
        # Other ASGI apps for exact HTTP paths (the MCP endpoint), given by the composition root.
        self.http_mounts = {path: app for paths, app in (http_mounts or {}).items() for path in paths}
        allow_protocol_close_codes()
        if not settings.MAIBOT_ADAPTER_TOKENS:
            logger.warning(
                "MAIBOT_ADAPTER_TOKENS is not set: adapters are accepted from loopback addresses%s only",
                " and MAIBOT_ADAPTER_ALLOW_FROM" if settings.MAIBOT_ADAPTER_ALLOW_FROM else "",
            )

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        get_gateway()
        if kind == "lifespan":
            return  # maibot.asgi's start-up call: the gateway runs from now on
        if scope.get("path") in ADAPTER_PATHS:
            if "EIO" in parse_qs(scope.get("query_string", b"").decode("latin-1")):
                # Imported with the first 0.7.x adapter: python-socketio (with redis and aiohttp, which it
                # imports) is about a third of the server's memory at rest, unused by 0.6.x adapters.
                from chat.gateway.mm07 import socketio_app

                return await socketio_app(scope, receive, send)
            if kind == "websocket":
                return await plain_adapter_app(scope, receive, send)
        if kind == "http":
            mounted = self.http_mounts.get(scope.get("path"))
            if mounted is not None:
                return await mounted(scope, receive, send)
            return await self.http(scope, receive, send)
        return await self.websocket(scope, receive, send)
