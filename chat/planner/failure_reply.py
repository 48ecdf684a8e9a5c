"""What a private chat's user hears when the model cannot answer (a wrong key, the provider down):
`chat.model_failure_reply`, through the one send service, at most once per
`chat.model_failure_reply_interval` per chat, instead of silence. Groups are not told: a bot that
stays silent there is not rude."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from chat.models import ChatSession, Direction, Message, PlannerCycle, SourceKind
from chat.services import message_send
from core.config import get_config

# The mark on the message (Message.extra): how the interval is kept, across processes and restarts.
MARK = "model_failure"


def failure_reply_send(*, session: ChatSession, cycle: PlannerCycle) -> Message | None:
    """Tell the user of a private chat that the model failed (None: not told, by rule or interval)."""
    cfg = get_config().chat
    text = cfg.model_failure_reply.strip()
    if not text or not session.is_private:
        return None
    since = timezone.now() - timedelta(seconds=cfg.model_failure_reply_interval)
    told = Message.objects.filter(session=session, direction=Direction.OUT, time__gte=since, **{f"extra__{MARK}": True})
    if told.exists():
        return None
    return message_send(
        session=session, source_kind=SourceKind.REPLY, text=text, extra={"cycle_id": str(cycle.cycle_id), MARK: True}
    )
