"""The fate of what the bot sent: one derivation from the outbound Message's delivery state, read by every
surface that tells an operator or an API client what became of a message (admin, API, dashboard).

A row that sends one outbound message (a scheduled or proactive message) shows its own status until the
message exists; from then on it shows the message's fate. The table `SENDER_FATE` is that derivation;
`sender_fate` (Python, on loaded rows), `sender_fate_expression` (SQL, for ordering and grouping) and
`sender_fate_q` (SQL, for filtering) are all read from it, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Case, CharField, Count, F, Q, Value, When
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from chat.models import DeliveryStatus, Direction, Message


class Fate(models.TextChoices):
    """What became of a message the bot meant to send, as every surface shows it."""

    PENDING = "pending", _("Pending")
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent (awaiting confirmation)")
    DELIVERED = "delivered", _("Delivered")
    UNCONFIRMED = "unconfirmed", _("Unconfirmed")
    FAILED = "failed", _("Failed")
    # Withdrawn before anything was sent (a cancelled scheduled message).
    CANCELLED = "cancelled", _("Cancelled")


# The fate of a sender once its outbound message exists, by that message's delivery status. A message
# still in the outbox (pending: waiting for its adapter; sending: being handed over) makes its sender
# `sending`: its own `pending` means "not sent yet, may still be cancelled", which is no longer true.
SENDER_FATE: dict[str, Fate] = {
    DeliveryStatus.PENDING: Fate.SENDING,
    DeliveryStatus.SENDING: Fate.SENDING,
    DeliveryStatus.SENT: Fate.SENT,
    DeliveryStatus.DELIVERED: Fate.DELIVERED,
    DeliveryStatus.UNCONFIRMED: Fate.UNCONFIRMED,
    DeliveryStatus.FAILED: Fate.FAILED,
}

# The fates an operator should look at: the message did not (provably) arrive and nothing will retry it.
NEEDS_ATTENTION = (Fate.UNCONFIRMED, Fate.FAILED)
# The delivery states an operator may put back in the outbox (chat.services.messages_resend).
RESENDABLE = (DeliveryStatus.UNCONFIRMED, DeliveryStatus.FAILED)

FATE_COLOURS: dict[str, str] = {
    Fate.PENDING: "#2563eb",
    Fate.SENDING: "#7c3aed",
    Fate.SENT: "#0891b2",
    Fate.DELIVERED: "#16a34a",
    Fate.UNCONFIRMED: "#d97706",
    Fate.FAILED: "#dc2626",
    Fate.CANCELLED: "#6b7280",
}


def message_fate(message: Message) -> Fate | None:
    """An outbound message's own fate (its delivery status); None for an inbound one."""
    return Fate(message.delivery_status) if message.direction == Direction.OUT else None


def sender_fate(own_status: str, message: Message | None) -> Fate:
    """The fate of a row that sends `message` (None until written): its own status until then."""
    if message is not None and message.delivery_status in SENDER_FATE:
        return SENDER_FATE[message.delivery_status]
    return Fate(own_status)


def sender_fate_expression(message: str, own_status: str) -> Case:
    """`sender_fate` in SQL: `message` is the path to the outbound Message, `own_status` the sender's field."""
    return Case(
        *(When(**{f"{message}__delivery_status": s}, then=Value(str(fate))) for s, fate in SENDER_FATE.items()),
        default=F(own_status),
        output_field=CharField(),
    )


def sender_fate_q(message: str, own_status: str, fates: Iterable[str]) -> Q:
    """Rows whose `sender_fate` is one of `fates`, as a filter the database can serve from its indexes."""
    fates = {str(f) for f in fates}
    states = [s for s, fate in SENDER_FATE.items() if fate in fates]
    q = Q(**{f"{message}__isnull": True, f"{own_status}__in": sorted(fates)})
    if states:
        q |= Q(**{f"{message}__delivery_status__in": states})
    return q


# --- counts ---------------------------------------------------------------------------------------

# The window of the "recent" delivery counts the dashboard and the adapter list show.
RECENT_DELIVERY_HOURS = 24


def recent_delivery_since(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(hours=RECENT_DELIVERY_HOURS)


def _zero() -> dict[str, int]:
    return dict.fromkeys(DeliveryStatus.values, 0)


@dataclass
class FateCounts:
    """Outbound messages per delivery state: `recent` (written since `since`) and `open` (every message
    still unconfirmed or failed, however old: a failure never drops out of the count by age)."""

    since: datetime | None
    recent: dict[str, int] = field(default_factory=_zero)
    open: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESENDABLE, 0))


def outbound_fate_counts(*, since: datetime | None) -> dict[str, FateCounts]:
    """Per platform (and "" for all of them), outbound messages per delivery state: two grouped queries."""
    counts: dict[str, FateCounts] = {"": FateCounts(since)}
    outbound = Message.objects.filter(direction=Direction.OUT).order_by()
    recent = outbound.filter(time__gte=since) if since is not None else outbound
    # The open ones are read through the (delivery_status, id) index, however large the table.
    open_ = outbound.filter(delivery_status__in=RESENDABLE)
    for part, rows in (("recent", recent), ("open", open_)):
        for platform, status, n in rows.values_list("session__platform", "delivery_status").annotate(n=Count("id")):
            for key in ("", platform):
                bucket = getattr(counts.setdefault(key, FateCounts(since)), part)
                bucket[status] = bucket.get(status, 0) + n
    return counts
