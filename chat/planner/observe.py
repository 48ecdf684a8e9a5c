"""Observing a session's news: the inbound messages stored since a runtime last looked, and the receive
hook points (chat.events) each one passes before the planner may see it.

Messages are found by primary key (`pk > after_pk`), so wakes that coalesce lose none. A receive
handler may rewrite a message's text (stored) or stop it (stored, never planned); with nobody
listening the hooks cost nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from chat import events
from chat.accounts import bot_account
from chat.models import ChatSession, Direction, Message
from chat.services import message_hooks_apply
from core.aio import db

logger = logging.getLogger(__name__)

RECEIVE_POINTS = (events.Point.RECEIVE_BEFORE_PROCESS, events.Point.RECEIVE_AFTER_PROCESS)


@dataclass
class Observation:
    messages: list[Message]
    bot_message_ids: set[str]
    bot_account: str = ""
    session: ChatSession | None = None


def observe(*, session_pk: int, after_pk: int, platform: str = "", load_session: bool = False) -> Observation:
    """Inbound messages of a session stored after `after_pk`, which quoted ids are the bot's own, and the
    bot's account on the session's platform; with `load_session`, the session row too (in the same trip
    to the database thread: an idle runtime does not hold it). ChatSession.DoesNotExist if it is gone."""
    session = ChatSession.objects.get(pk=session_pk) if load_session else None
    if session is not None:
        platform = session.platform
    messages = list(
        Message.objects.filter(session_id=session_pk, direction=Direction.IN, pk__gt=after_pk).order_by("pk")
    )
    quoted = {m.reply_to_platform_id for m in messages if m.reply_to_platform_id}
    own = set()
    if quoted:
        own = set(
            Message.objects.filter(
                session_id=session_pk, direction=Direction.OUT, platform_message_id__in=quoted
            ).values_list("platform_message_id", flat=True)
        )
    return Observation(
        messages=messages,
        bot_message_ids=own,
        bot_account=bot_account(platform) if messages and platform else "",
        session=session,
    )


aobserve = db(observe)
_hooks_apply = db(message_hooks_apply)


async def receive_points(messages: list[Message], session: ChatSession) -> list[Message]:
    """The messages that pass the receive hook points, their text as the handlers left it."""
    if not messages or not any(events.has_handlers(p) for p in RECEIVE_POINTS):
        return messages
    kept = []
    for message in messages:
        text, aborted_by = message.text, ""
        for point in RECEIVE_POINTS:
            emission = await events.aemit(point, message=message, session=session, text=text)
            if isinstance(emission.kwargs.get("text"), str):
                text = emission.kwargs["text"]
            if emission.aborted:
                aborted_by = emission.aborted_by
                break
        if text != message.text or aborted_by:
            await _hooks_apply(message=message, text=text, aborted_by=aborted_by)
        if aborted_by:
            logger.info("message %s stopped by %s", message.pk, aborted_by)
        else:
            kept.append(message)
    return kept
