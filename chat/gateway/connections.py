"""Live sockets this process can write frames to: a 0.6.x plain websocket, a 0.7.x Socket.IO client, a
browser chat page; and the websocket close codes the gateway uses."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from chat.outbox import WEB_PLATFORM
from chat.wire.outbound import plain_text_frame

if TYPE_CHECKING:
    import socketio

CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008


class Connection:
    """A live socket this process can write frames to."""

    platform: str = ""
    protocol: str = ""
    remote: str = ""
    closed: bool = False
    # Frames queued for storage but not stored yet: the flood guard.
    backlog: int = 0
    record_id: int | None = None
    # maim_message's API-Server mode (chat.gateway.auth): frames both ways travel in its packages, and
    # each frame it sends is acknowledged; `client_uuid` is its `x-uuid` header.
    api_server: bool = False
    client_uuid: str = ""
    # The code we closed it with (replaced, flood, bad token), which is what the record keeps.
    close_code: int | None = None
    # The delivery gate, for a platform whose adapter echoes (chat.delivery_gate): when it opened,
    # whether an echo came over it since (or since it last missed a confirm deadline), and the one row
    # handed to it meanwhile.
    opened_at: datetime | None = None
    # Set once the connection is recorded and the platform's echo history read: until then the
    # gateway does not know whether it is gated, so nothing is handed to it.
    ready: bool = False
    proven: bool = False
    probe_id: int | None = None

    async def send(self, frame: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def close(self, code: int) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        mode = " api-server" if self.api_server else ""
        return f"<{self.protocol}{mode} {self.platform} {self.remote}>"


class PlainAdapterConnection(Connection):
    """maim_message ≤ 0.6.x: a plain websocket carrying JSON text frames."""

    protocol = "ws"

    def __init__(self, *, platform: str, remote: str, send) -> None:
        self.platform, self.remote, self._send = platform, remote, send

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed:
            return False
        await self._send({"type": "websocket.send", "text": plain_text_frame(frame)})
        return not self.closed

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self._send({"type": "websocket.close", "code": code})


class SocketIOAdapterConnection(Connection):
    """maim_message ≥ 0.7.0: a Socket.IO client; frames are `message` events."""

    protocol = "socketio"

    def __init__(self, *, platform: str, remote: str, sid: str, server: socketio.AsyncServer) -> None:
        self.platform, self.remote, self.sid, self._server = platform, remote, sid, server

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed or not self._server.manager.is_connected(self.sid, "/"):
            return False
        await self._server.emit("message", frame, to=self.sid)
        return True

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self._server.disconnect(self.sid)


class BrowserConnection(Connection):
    """The operator chat page's socket (platform `web`): a chat.consumers.ChatPageConsumer."""

    protocol = "browser"
    platform = WEB_PLATFORM

    def __init__(self, *, user_id: str, consumer) -> None:
        self.user_id, self.consumer = user_id, consumer

    async def send(self, frame: dict[str, Any]) -> bool:
        if self.closed:
            return False
        await self.consumer.send_json(frame)
        return True

    async def close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            self.close_code = code
            await self.consumer.close(code=code)
