"""maim_message ≥ 0.7.x at /ws: the Socket.IO server (Engine.IO v4, long-polling and websocket), its
connect / disconnect / `message` handlers, and its ASGI app; adapters in legacy or API-Server mode
(chat.gateway.auth)."""

from __future__ import annotations

import logging
from typing import Any

import socketio

from chat.gateway.auth import adapter_auth_problem, adapter_hello, environ_headers, refusal_log
from chat.gateway.connections import SocketIOAdapterConnection
from chat.gateway.registry import get_gateway
from core.config import get_config

logger = logging.getLogger(__name__)

# The largest frame an adapter may send (base64 media): the wire protocol's figure, as the reference
# server allows. A constant, not a bot-config field: daphne takes its websocket size limit on its command
# line when it starts (maibot/management/commands/serve.py passes this same figure) and this server is
# built at import, so a config reload could change neither.
MAX_FRAME_BYTES = 100 * 1024 * 1024


def _pings() -> tuple[float, float]:
    """Engine.IO's ping interval and timeout for gateway.keepalive_seconds (read when the server starts).

    What they do (python-engineio 4): the server pings each client `ping_interval` after its last pong;
    a client whose pong has not come within `ping_timeout` is closed by the service task, which looks at
    each socket once per `ping_timeout`. So a frozen client is dropped at most interval + 2 × timeout
    after its last pong.
    """
    keepalive = get_config().gateway.keepalive_seconds
    return keepalive * 0.4, keepalive * 0.25


PING_INTERVAL, PING_TIMEOUT = _pings()

sio = socketio.AsyncServer(
    async_mode="asgi",
    # Adapters are not browsers; no Origin header to check.
    cors_allowed_origins=[],
    max_http_buffer_size=MAX_FRAME_BYTES,
    ping_interval=PING_INTERVAL,
    ping_timeout=PING_TIMEOUT,
    # Handlers run one at a time per server so a connection's frames are stored in order.
    async_handlers=False,
    logger=False,
    engineio_logger=False,
)
_sio_conns: dict[str, SocketIOAdapterConnection] = {}


@sio.event
async def connect(sid: str, environ: dict, auth: Any = None) -> None:
    gateway = get_gateway()
    scope = environ.get("asgi.scope") or {}
    client = scope.get("client") or ("", 0)
    headers = environ_headers(environ)
    hello = adapter_hello(headers)
    problem = adapter_auth_problem(
        platform=hello.platform, token=hello.token, client_host=client[0], api_server=hello.api_server
    )
    if problem:
        mode = "API-Server Socket.IO" if hello.api_server else "Socket.IO"
        refusal_log.refused(address=str(client[0]), reason=problem, platform=hello.platform, mode=mode)
        # The client's connect fails with this reason (its connect_error event).
        raise socketio.exceptions.ConnectionRefusedError(problem)
    conn = SocketIOAdapterConnection(platform=hello.platform, remote=f"{client[0]}:{client[1]}", sid=sid, server=sio)
    conn.api_server, conn.client_uuid = hello.api_server, headers.get("x-uuid", "")[:128]
    _sio_conns[sid] = conn
    await gateway.connections.adapter_connected(conn)


@sio.event
async def disconnect(sid: str, reason: Any = None) -> None:
    conn = _sio_conns.pop(sid, None)
    if conn is not None:
        await get_gateway().connections.adapter_disconnected(conn, None)


@sio.on("message")
async def message(sid: str, data: Any) -> None:
    conn = _sio_conns.get(sid)
    if conn is None:
        return
    gateway = get_gateway()
    if isinstance(data, str | bytes):
        await gateway.frames.frame_text(conn, data.decode("utf-8", "replace") if isinstance(data, bytes) else data)
    else:
        await gateway.frames.frame_data(conn, data)


socketio_app = socketio.ASGIApp(sio, socketio_path="ws")
