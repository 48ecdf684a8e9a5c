"""What maim_message's API-Server mode asks of the gateway on receipt: a `sys_ack` for each frame that
carries a msg_id, and taking a package the client resends only once."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from chat.gateway.connections import Connection
from chat.wire.outbound import api_server_ack

logger = logging.getLogger(__name__)

# API-Server packages remembered by msg_id, so one the client resends (from its cache, after a reconnect,
# when our ack did not reach it) is not stored twice; maim_message's own server remembers them an hour.
API_SEEN_MAX = 4096


class ApiServerReceipts:
    """Acknowledges API-Server frames and remembers the last API_SEEN_MAX packages taken in, per
    platform and msg_id (a resent one is dropped)."""

    def __init__(self) -> None:
        # (platform, msg_id) of API-Server packages already taken in, oldest first (API_SEEN_MAX).
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def acknowledge(self, conn: Connection, data: dict[str, Any]) -> None:
        """An API-Server client expects a `sys_ack` for every frame it sends (but acks) that carries a
        msg_id, as maim_message's own server sends it on receipt: the client resends unacknowledged
        frames from its cache when it reconnects."""
        msg_id = data.get("msg_id")
        if data.get("type") == "sys_ack" or not isinstance(msg_id, str) or not 0 < len(msg_id) <= 256:
            return
        try:
            await conn.send(api_server_ack(msg_id, connection_uuid=conn.client_uuid))
        except Exception as exc:
            logger.debug("acknowledging a frame of %r failed: %s", conn, exc)

    def seen_before(self, conn: Connection, data: dict[str, Any]) -> bool:
        """Whether this API-Server package (by msg_id) was taken in already; remembers it if not."""
        msg_id = data.get("msg_id")
        if data.get("type") == "sys_ack" or not isinstance(msg_id, str) or not msg_id:
            return False
        key = (conn.platform, msg_id[:256])
        if key in self._seen:
            logger.info("package %s from %r dropped: received before (resent by the client)", key[1][:64], conn)
            return True
        self._seen[key] = None
        if len(self._seen) > API_SEEN_MAX:
            self._seen.popitem(last=False)
        return False
