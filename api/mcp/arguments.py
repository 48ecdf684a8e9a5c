"""The MCP endpoint's tool arguments: one strict schema per tool, shared with the API's input shapes
(api.http) so both refuse the same input the same way."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from api.http import (
    AnchorIn,
    ConversationFilters,
    ImageIn,
    MessageFilters,
    PageParams,
    SegmentIn,
    StrictSchema,
)


class Strict(StrictSchema):
    """Tool arguments: storable text, bounded instants, no unknown fields (as the API's bodies)."""


class Anchor(AnchorIn, Strict):
    pass


IDEMPOTENCY_KEY = Field(
    None,
    max_length=255,
    description="Repeat a call safely: the same key and arguments get the first answer and send nothing again.",
)


class SendMessageArgs(Anchor):
    type: Literal["text", "rich_text", "image"] = "text"
    text: str | None = Field(None, description="type text: the message; type image: an optional caption.")
    format: Literal["plain", "markdown"] = Field("plain", description="type text only.")
    segments: list[SegmentIn] | None = Field(None, description="type rich_text: text, image and mention segments.")
    image: ImageIn | None = Field(None, description="type image: the image, as base64 or url.")
    send_at: datetime | None = Field(
        None, description="ISO 8601 with offset. Absent: sent now, in this call. Else: delivered at that time."
    )
    idempotency_key: str | None = IDEMPOTENCY_KEY


MESSAGE_ID = Field(pattern=r"^[A-Za-z0-9_]{1,32}$", description="The message id, e.g. sm_k3v9xq2mtr.")


class MessageIdArgs(Strict):
    message_id: str = MESSAGE_ID


class CancelMessageArgs(Strict):
    message_id: str = MESSAGE_ID
    reason: str | None = Field(None, max_length=255, description="Why; shown with the message.")
    idempotency_key: str | None = IDEMPOTENCY_KEY


class ListMessagesArgs(MessageFilters, PageParams, Strict):
    pass


class ListConversationsArgs(ConversationFilters, PageParams, Strict):
    pass


class NoArgs(Strict):
    pass


class InnerStateArgs(Strict):
    text: str = Field(description="The new inner state (replaces the old one; the change is kept as a revision).")


WHERE = Field(
    None,
    max_length=128,
    description="A conversation id: that conversation's. Absent: global (the bot's own).",
)


class WhereArgs(Strict):
    conversation_id: str | None = WHERE


class RememberArgs(Strict):
    key: str = Field(max_length=64, description="A short name for the fact (one line, ≤ 64 characters).")
    content: str = Field(description="The fact itself, briefly.")
    conversation_id: str | None = WHERE


class ForgetArgs(Strict):
    key: str = Field(max_length=64)
    conversation_id: str | None = WHERE


class SetTimerArgs(Strict):
    spec: str = Field(
        max_length=200,
        description="When: a delay (5min, 2h), every:<delay>, once:YYYY-MM-DD HH:MM (the bot's time zone), "
        "cron:<5 fields>.",
    )
    label: str = Field(max_length=200, description="What the timer is for, in a few words.")
    payload: str = Field("", description="Details for the bot when it fires; say:<text> sends <text> as written.")
    conversation_id: str | None = WHERE


class CancelTimerArgs(Strict):
    timer_id: str = Field(max_length=32, description="The timer's id, e.g. tm_k3v9xq2mtr.")
    conversation_id: str | None = WHERE
