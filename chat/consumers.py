"""The operator chat page's websocket: a person chats with the bot as a private chat on platform `web`."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from chat.gateway import BrowserConnection, get_gateway
from chat.ingest import InboundItem
from chat.outbox_rows import WEB_PLATFORM
from chat.wire.inbound import InboundMessage, MessageInfo, UserInfo
from core.config import get_config
from core.text import is_blank, text_problem
from core.websocket import JsonFrameConsumer

logger = logging.getLogger(__name__)

CLOSE_UNAUTHORISED = 4403


class ChatPageConsumer(JsonFrameConsumer):
    """Inbound: {"type": "send", "text": ...}. Outbound: the bot's messages and errors, as JSON."""

    # The gateway writes to this socket directly (chat.outbox delivers platform `web`), so the
    # consumer needs no channel-layer channel: an alias that is not configured means none (and no
    # Redis reader per browser tab).
    channel_layer_alias = "chat-page-needs-no-layer"

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_staff:
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        await self.accept()
        self.user = user
        self.conn = BrowserConnection(user_id=str(user.pk), consumer=self)
        get_gateway().connections.browser_connected(self.conn)

    async def disconnect(self, code: int) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            get_gateway().connections.browser_disconnected(conn)

    async def receive_json(self, content: Any, **kwargs) -> None:
        if not isinstance(content, dict) or content.get("type") != "send":
            await self.send_error('expected {"type": "send", "text": ...}')
            return
        text = content.get("text")
        if not isinstance(text, str) or is_blank(text):
            await self.send_error("the message is empty")
            return
        if problem := text_problem(text):
            logger.warning("chat page message from user %s dropped: it %s", self.user.pk, problem)
            await self.send_error(f"the message {problem}")
            return
        config = get_config().gateway
        if len(text) > config.browser_max_text_length:
            await self.send_error(f"the message is longer than {config.browser_max_text_length} characters")
            return
        if self.conn.backlog >= config.max_backlog:
            await self.send_error("too many messages at once; try again in a moment")
            return
        info = MessageInfo(
            platform=WEB_PLATFORM,
            # The browser has no platform id; ours lets the bot quote the message.
            message_id=str(uuid.uuid4()),
            time=time.time(),
            user_info=UserInfo(
                platform=WEB_PLATFORM, user_id=str(self.user.pk), user_nickname=self.user.get_username()
            ),
        )
        item = InboundItem(
            platform=WEB_PLATFORM,
            message=InboundMessage(info=info, segments=[{"type": "text", "data": text}]),
            received_at=time.time(),
        )
        get_gateway().frames.enqueue_message(self.conn, item)

    @property
    def max_frame_chars(self) -> int:
        # Room for the longest allowed message even if every character arrives \u-escaped.
        return 6 * get_config().gateway.browser_max_text_length + 1024

    async def send_error(self, message: str) -> None:
        await self.send_json({"type": "error", "error": message})
