"""The adapter gateway: maim_message websockets at /ws (0.6.x plain websocket, 0.7.x Socket.IO) and the
browser chat page's connections, one module per job:

- connections.py  the live sockets (plain websocket, Socket.IO, browser), close codes, and `Connections`:
                  this process's registry of them, which is the outbox's Sink (the delivery gate)
- auth.py         who may connect as an adapter
- frames.py       what an inbound frame becomes (parsed, checked, flood guard, queued for the writer)
- apiserver.py    API-Server mode's acks and resent-package dedupe
- registry.py     the per-process Gateway: the parts above put together, its lifecycle
- writer.py       the ingest writer task (batched storage, `inbound_stored`)
- mm06.py         the 0.6.x plain-websocket ASGI app
- mm07.py         the 0.7.x Socket.IO server
- daphne_patch.py lets daphne send close code 1008
- routing.py      GatewayRouter, the project's front ASGI app

The wire format itself (parsing, building frames) is chat.wire; delivery of outbound rows is chat.outbox;
wake-ups between processes are chat.notify.
"""

from chat.gateway.auth import adapter_auth_problem
from chat.gateway.connections import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    BrowserConnection,
    Connection,
    PlainAdapterConnection,
    SocketIOAdapterConnection,
)
from chat.gateway.registry import Gateway, get_gateway
from chat.gateway.routing import ADAPTER_PATHS, GatewayRouter
from chat.gateway.writer import close_old_connection

__all__ = [
    "ADAPTER_PATHS",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "BrowserConnection",
    "Connection",
    "Gateway",
    "GatewayRouter",
    "PlainAdapterConnection",
    "SocketIOAdapterConnection",
    "adapter_auth_problem",
    "close_old_connection",
    "get_gateway",
]
