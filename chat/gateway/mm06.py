"""maim_message ≤ 0.6.x at /ws: a plain websocket carrying JSON text frames (accept, authenticate — a bad
token is closed with 1008 —, then serve), in legacy or API-Server mode (chat.gateway.auth)."""

from __future__ import annotations

import logging

from chat.gateway.auth import adapter_auth_problem, adapter_hello, refusal_log
from chat.gateway.connections import CLOSE_POLICY, PlainAdapterConnection
from chat.gateway.registry import get_gateway

logger = logging.getLogger(__name__)


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def plain_adapter_app(scope, receive, send) -> None:
    """ASGI app for maim_message ≤ 0.6.x at /ws: accept, authenticate (bad token → close 1008), serve."""
    gateway = get_gateway()
    event = await receive()
    if event["type"] != "websocket.connect":
        return
    headers = _headers(scope)
    client = scope.get("client") or ("", 0)
    hello = adapter_hello(headers)
    await send({"type": "websocket.accept"})
    problem = adapter_auth_problem(
        platform=hello.platform, token=hello.token, client_host=client[0], api_server=hello.api_server
    )
    if problem:
        mode = "API-Server websocket" if hello.api_server else "websocket"
        refusal_log.refused(address=str(client[0]), reason=problem, platform=hello.platform, mode=mode)
        await send({"type": "websocket.close", "code": CLOSE_POLICY})
        return
    conn = PlainAdapterConnection(platform=hello.platform, remote=f"{client[0]}:{client[1]}", send=send)
    conn.api_server, conn.client_uuid = hello.api_server, headers.get("x-uuid", "")[:128]
    await gateway.connections.adapter_connected(conn)
    code = None
    try:
        while True:
            event = await receive()
            kind = event["type"]
            if kind == "websocket.receive":
                text = event.get("text")
                if text is None:
                    raw = event.get("bytes") or b""
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        logger.warning("binary frame from %r dropped: not UTF-8 JSON", conn)
                        continue
                await gateway.frames.frame_text(conn, text)
            elif kind == "websocket.disconnect":
                code = event.get("code")
                break
    finally:
        await gateway.connections.adapter_disconnected(conn, code)
