"""JSON websocket consumers that answer a bad frame with an error frame and stay open.

Channels' AsyncJsonWebsocketConsumer lets a frame that is not JSON (or JSON nested past the recursion
limit) raise, which closes the socket with 1011 and logs a traceback: client input must never do that.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

logger = logging.getLogger(__name__)


class JsonFrameConsumer(AsyncJsonWebsocketConsumer):
    """Frames must be JSON objects of at most `max_frame_chars`; anything else gets
    {"type": "error", "message": …} and the connection goes on."""

    max_frame_chars = 64 * 1024

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        content, problem = self.decode_frame(text_data)
        if problem:
            logger.warning("%s: refused a frame from the client: %s", type(self).__name__, problem)
            await self.send_error(problem)
            return
        await self.receive_json(content, **kwargs)

    def decode_frame(self, text_data: str | None) -> tuple[dict[str, Any], str]:
        if text_data is None:
            return {}, "send JSON text frames"
        if len(text_data) > self.max_frame_chars:
            return {}, f"a frame is at most {self.max_frame_chars} characters"
        try:
            content = json.loads(text_data)
        except RecursionError:
            return {}, "the frame is nested too deeply"
        except ValueError:
            return {}, "the frame is not JSON"
        if not isinstance(content, dict):
            return {}, "a frame must be a JSON object"
        return content, ""

    async def send_error(self, message: str) -> None:
        await self.send_json({"type": "error", "message": message})
