"""Rows handed to an adapter that answers each hand-over (an adapter plugin's gateway): the answer is the row's
fate, recorded with the claim machine (chat.outbox_rows.outbox_finish, `answered`), on the database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import AdapterPlatform, DeliveryStatus, Message
from chat.outbox_rows import Answered, outbox_claim, outbox_finish
from chat.services import message_send
from core.config import override

pytestmark = pytest.mark.django_db

CONFIRM = 10.0


@pytest.fixture(autouse=True)
def delivery_config():
    with override(gateway={"confirm_seconds": CONFIRM, "max_delivery_attempts": 2}) as cfg:
        yield cfg


def answer_round(now, answer: Answered) -> list[int]:
    """One deliverer round whose every row the adapter answers with `answer`."""
    token, batch = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={}, now=now)
    answered = {d.message_id: (d.platform, answer) for d in batch}
    outbox_finish(token=token, sent=[], released=[], failed={}, answered=answered, now=now)
    return list(answered)


def test_a_success_with_the_platform_id_is_delivered_and_the_platform_confirms(make_session):
    message = message_send(session=make_session(), source_kind="proactive", text="pong")
    now = timezone.now()
    assert answer_round(now, Answered(True, platform_id="1800000002")) == [message.pk]
    row = Message.objects.get(pk=message.pk)
    assert (row.delivery_status, row.platform_message_id, row.delivered_at, row.sent_at) == (
        DeliveryStatus.DELIVERED,
        "1800000002",
        now,
        now,
    )
    assert row.delivery_claim == "" and row.next_attempt_at is None
    assert AdapterPlatform.objects.get(platform="qq").first_echo_at == now


def test_a_success_without_an_id_is_sent_and_awaits_nothing(make_session):
    message = message_send(session=make_session(), source_kind="proactive", text="pong")
    answer_round(timezone.now(), Answered(True))
    row = Message.objects.get(pk=message.pk)
    assert (row.delivery_status, row.next_attempt_at, row.platform_message_id) == (DeliveryStatus.SENT, None, "")
    assert not AdapterPlatform.objects.filter(platform="qq", first_echo_at__isnull=False).exists()


def test_a_failure_waits_its_confirm_window_with_the_reason_then_fails_with_it(make_session):
    message = message_send(session=make_session(), source_kind="proactive", text="你好")
    now = timezone.now()
    refused = Answered(False, reason="消息发送失败")
    assert answer_round(now, refused) == [message.pk]
    row = Message.objects.get(pk=message.pk)
    assert (row.delivery_status, row.delivery_attempts) == (DeliveryStatus.PENDING, 1)
    assert row.delivery_error == "gateway_failed: 消息发送失败"
    assert row.next_attempt_at == now + timedelta(seconds=CONFIRM)
    assert answer_round(now + timedelta(seconds=CONFIRM - 1), refused) == []  # not due before its window
    later = now + timedelta(seconds=CONFIRM)
    assert answer_round(later, refused) == [message.pk]
    row = Message.objects.get(pk=message.pk)
    assert (row.delivery_status, row.delivery_attempts, row.next_attempt_at) == (DeliveryStatus.FAILED, 2, None)
    assert row.delivery_error == "gateway_failed: 消息发送失败"
