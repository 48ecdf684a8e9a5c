"""One truth about a message's fate: whatever state the outbound Message is in, the scheduled message, the
API's status, the admin badges and filters, and the dashboard all say the same; a crash that failed rows
`delivery_interrupted` shows as failed everywhere; operators resend unconfirmed or failed messages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chat.delivery_errors import DeliveryError
from chat.fate import (
    Fate,
    sender_fate,
    sender_fate_expression,
    sender_fate_q,
)
from chat.ingest import outbound_receipt_apply
from chat.models import AdapterPlatform, DeliveryStatus, Message, SourceKind
from chat.outbox_rows import outbox_claim, outbox_sweep
from chat.services import message_send, messages_resend
from scheduling.dispatcher import deliver_due
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create
from tests.api.support import api, png_base64, token_pair  # noqa: F401

pytestmark = pytest.mark.django_db

SCHEDULED = reverse("admin:scheduling_scheduledmessage_changelist")
MESSAGES = reverse("admin:chat_message_changelist")
PLATFORMS = reverse("admin:chat_adapterplatform_changelist")
DASHBOARD = "/admin/console/"

# Every delivery state, the fate a message's sender shows for it, and the reason stored with it.
CASES = [
    (DeliveryStatus.PENDING, Fate.SENDING, ""),
    (DeliveryStatus.SENDING, Fate.SENDING, ""),
    (DeliveryStatus.SENT, Fate.SENT, ""),
    (DeliveryStatus.DELIVERED, Fate.DELIVERED, ""),
    (DeliveryStatus.UNCONFIRMED, Fate.UNCONFIRMED, "no_echo"),
    (DeliveryStatus.FAILED, Fate.FAILED, DeliveryError.ADAPTER_OFFLINE),
]


@pytest.fixture
def operator(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def put(message: Message, status: str, error: str = "") -> None:
    """Set an outbound row into `status` directly, with the fields that state carries."""
    now = timezone.now()
    fields = {"delivery_status": status, "delivery_error": error, "delivery_claim": "", "delivery_lease_until": None}
    if status == DeliveryStatus.SENDING:
        fields.update(delivery_claim="c" * 32, delivery_lease_until=now + timedelta(minutes=1))
    if status in (DeliveryStatus.SENT, DeliveryStatus.DELIVERED, DeliveryStatus.UNCONFIRMED):
        fields.update(sent_at=now, delivery_attempts=1)
    if status == DeliveryStatus.DELIVERED:
        fields.update(delivered_at=now, platform_message_id="9001")
    Message.objects.filter(pk=message.pk).update(**fields)


def row(html: str, needle: str) -> str:
    """The changelist row that mentions `needle`."""
    rows = [r for r in html.split("<tr")[1:] if needle in r]
    assert len(rows) == 1, f"{needle} in {len(rows)} rows"
    return rows[0].split("</tr>", 1)[0]


def badges(html: str) -> list[str]:
    return re.findall(r'class="mb-badge"[^>]*>([^<]+)</span>', html)


def scheduled_figures(page: str) -> dict[str, int]:
    block = page.split('id="scheduled"', 1)[1].split('class="module"', 1)[0]
    return {k: int(v) for k, v in re.findall(r'<th scope="row">(\w+)</th><td class="console-figure">(\d+)</td>', block)}


def delivery_figures(page: str, platform: str) -> dict[str, int]:
    """One platform's row of the dashboard's outbound table: the last day's states, then the open ones."""
    block = page.split('id="delivery"', 1)[1].split('id="lateness"', 1)[0]
    line = re.search(rf'<th scope="row">{platform}</th>(.*?)</tr>', block, re.S).group(1)
    numbers = [int(n) for n in re.findall(r">(\d+)<", line)]
    keys = [*(f"recent_{s}" for s in DeliveryStatus.values), "open_unconfirmed", "open_failed"]
    assert len(numbers) == len(keys), line
    return dict(zip(keys, numbers, strict=True))


def api_send_now(api, session) -> tuple[str, Message]:  # noqa: F811
    body = api.post("/messages", {"conversation_id": session.session_id, "text": "你好 fate"}).json()
    return body["id"], Message.objects.get(uid=body["delivery"]["message_id"])


@pytest.mark.parametrize(("status", "fate", "error"), CASES, ids=[c[0] for c in CASES])
def test_every_surface_shows_the_outbound_message_fate(api, operator, make_session, status, fate, error):  # noqa: F811
    task_id, message = api_send_now(api, make_session())
    put(message, status, error)
    others = [f for f in Fate.values if f != fate]

    # The API: the top-level status, its reason, and the status filter.
    detail = api.get(f"/messages/{task_id}").json()
    assert (detail["status"], detail["delivery"]["status"]) == (fate, status)
    assert detail["failure_reason"] == (error or None)
    assert [m["id"] for m in api.get("/messages", {"status": fate}).json()["items"]] == [task_id]
    for other in others:
        assert api.get("/messages", {"status": other}).json()["count"] == 0, other

    # The scheduled messages' admin: the badge (with the reason) and the status filter.
    line = row(operator.get(SCHEDULED).content.decode(), task_id)
    assert badges(line) == [Fate(fate).label]
    assert not error or error in line
    assert task_id in operator.get(SCHEDULED, {"status": fate}).content.decode()
    for other in others:
        assert task_id not in operator.get(SCHEDULED, {"status": other}).content.decode(), other

    # The messages' admin: the outbound message's own state, and the delivery filter.
    line = row(operator.get(MESSAGES).content.decode(), "你好 fate")
    assert badges(line) == [Fate(status).label]
    assert "你好 fate" in operator.get(MESSAGES, {"delivery": status}).content.decode()
    attention = operator.get(MESSAGES, {"delivery": "attention"}).content.decode()
    assert ("你好 fate" in attention) == (fate in (Fate.UNCONFIRMED, Fate.FAILED))

    # The dashboard: the scheduled counts and the outbound counts of the platform.
    page = operator.get(DASHBOARD).content.decode()
    shown = scheduled_figures(page)
    assert sum(shown.values()) == (1 if fate.label in shown else 0)
    if fate.label in shown:
        assert shown[fate.label] == 1
    figures = delivery_figures(page, "qq")
    assert {k: v for k, v in figures.items() if v} == {
        f"recent_{status}": 1,
        **({f"open_{status}": 1} if fate in (Fate.UNCONFIRMED, Fate.FAILED) else {}),
    }


def test_a_crash_mid_delivery_shows_failed_everywhere(api, operator, make_session):  # noqa: F811
    """Why 7: the server died holding claimed rows; their lease ran out and they failed
    `delivery_interrupted`. The scheduled messages, the API, the badges and the dashboard all say failed."""
    sent_now = [api_send_now(api, make_session())[0] for _ in range(3)]
    planned = []
    for i in range(2):
        task = scheduled_message_create(
            session=make_session(),
            send_at=timezone.now() + timedelta(hours=1),
            message_text=f"later {i}",
            acted_by=SYSTEM,
        ).task
        planned.append(task.pk)
    assert deliver_due(now=timezone.now() + timedelta(hours=1, seconds=1)).sent == 2
    _, claimed = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={}, lease_seconds=30)
    assert len(claimed) == 5  # handed to a deliverer that then died: never finished
    assert outbox_sweep(now=timezone.now() + timedelta(seconds=31)) == (0, 5)
    assert set(Message.objects.values_list("delivery_error", flat=True)) == {DeliveryError.INTERRUPTED}
    # The scheduled rows themselves still say they wrote their message: the fate comes from the message.
    assert set(ScheduledMessage.objects.values_list("status", flat=True)) == {ScheduledStatus.SENT}

    for task_id in sent_now:
        detail = api.get(f"/messages/{task_id}").json()
        assert (detail["status"], detail["failure_reason"]) == ("failed", "delivery_interrupted")
    assert api.get("/messages", {"status": "failed"}).json()["count"] == 3
    assert api.get("/messages", {"status": "sent"}).json()["count"] == 0

    changelist = operator.get(SCHEDULED).content.decode()
    for task_id in [*sent_now, *planned]:
        line = row(changelist, task_id)
        assert badges(line) == ["Failed"] and "delivery_interrupted" in line
    failed_only = operator.get(SCHEDULED, {"status": "failed"}).content.decode()
    assert failed_only.count('name="_selected_action"') == 5
    assert badges(operator.get(MESSAGES, {"delivery": "failed"}).content.decode()) == ["Failed"] * 5

    page = operator.get(DASHBOARD).content.decode()
    assert scheduled_figures(page)["Failed"] == 5
    figures = delivery_figures(page, "qq")
    assert (figures["recent_failed"], figures["open_failed"], figures["recent_sent"]) == (5, 5, 0)
    errors = page.split('id="errors"', 1)[1]
    assert all(task_id in errors for task_id in [*sent_now, *planned])
    assert errors.count("delivery_interrupted") == 10  # each scheduled message, and each outbound message


def test_sender_fate_in_python_sql_and_filter_agree(make_session):
    """The three readings of the one derivation, over every state a scheduled message can be in."""
    expected = {}
    for own in ScheduledStatus.values:
        for status in DeliveryStatus.values if own == ScheduledStatus.SENT else [None]:
            task = scheduled_message_create(
                session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text="x", acted_by=SYSTEM
            ).task
            fields = {"status": own, "last_error": "e" if own == ScheduledStatus.FAILED else ""}
            if own == ScheduledStatus.SENT:
                message = message_send(session=task.session, source_kind=SourceKind.SCHEDULED_SEND, text="x")
                put(message, status)
                fields.update(sent_message=message, sent_at=timezone.now())
            if own == ScheduledStatus.SENDING:
                fields.update(claim_token="t", lease_until=timezone.now())
            if own == ScheduledStatus.CANCELLED:
                fields.update(cancelled_at=timezone.now())
            ScheduledMessage.objects.filter(pk=task.pk).update(**fields)
            expected[task.pk] = Fate(own) if status is None else Fate(status if status != "pending" else "sending")

    rows = ScheduledMessage.objects.select_related("sent_message").annotate(
        fate=sender_fate_expression("sent_message", "status")
    )
    assert {t.pk: sender_fate(t.status, t.sent_message) for t in rows} == expected
    assert {t.pk: t.fate for t in rows} == expected
    for fate in Fate.values:
        found = set(
            ScheduledMessage.objects.filter(sender_fate_q("sent_message", "status", [fate])).values_list(
                "pk", flat=True
            )
        )
        assert found == {pk for pk, f in expected.items() if f == fate}, fate


# --- resend ---------------------------------------------------------------------------------------


def _outbound(make_session, status, error="", text="x"):
    message = message_send(session=make_session(), source_kind=SourceKind.REPLY, text=text)
    put(message, status, error)
    return Message.objects.get(pk=message.pk)


def _staff(*perms: str) -> Client:
    user = User.objects.create_user(f"staff{User.objects.count()}", password="pw", is_staff=True)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_resend_action_needs_its_permission_and_puts_back_only_unconfirmed_or_failed(make_session):
    failed = _outbound(make_session, DeliveryStatus.FAILED, DeliveryError.INTERRUPTED, text="lost in a crash")
    unconfirmed = _outbound(make_session, DeliveryStatus.UNCONFIRMED, "no_echo", text="never echoed")
    delivered = _outbound(make_session, DeliveryStatus.DELIVERED, text="arrived")
    # Queued two hours ago: past the offline expiry, yet a resend gives it its full wait again.
    Message.objects.filter(pk=failed.pk).update(created_at=timezone.now() - timedelta(hours=2))
    ids = [failed.pk, unconfirmed.pk, delivered.pk]
    post = {"action": "resend_selected", ACTION_CHECKBOX_NAME: ids, "index": 0}

    viewer = _staff("chat.view_message")
    assert "resend_selected" not in viewer.get(MESSAGES).content.decode()
    before = list(Message.objects.order_by("pk").values())
    viewer.post(MESSAGES, post, follow=True)
    assert list(Message.objects.order_by("pk").values()) == before

    resender = _staff("chat.view_message", "chat.resend_message")
    page = resender.post(MESSAGES, post, follow=True).content.decode()
    assert "Put 2 message(s) back in the outbox." in page
    assert "Skipped 1" in page
    back = {m.pk: m for m in Message.objects.filter(pk__in=ids)}
    for m, was, error in ((failed, "failed", "delivery_interrupted"), (unconfirmed, "unconfirmed", "no_echo")):
        now = back[m.pk]
        assert (now.delivery_status, now.delivery_error, now.delivery_attempts) == ("pending", "", 0)
        [record] = now.extra["resends"]
        assert (record["status"], record["error"], record["by"]) == (was, error, "operator:staff1")
    assert back[delivered.pk].delivery_status == "delivered" and "resends" not in back[delivered.pk].extra
    # Both are claimable again (the one queued two hours ago too), and the sweep leaves them.
    assert outbox_sweep() == (0, 0)
    _, claimed = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})
    assert {d.message_id for d in claimed} == {failed.pk, unconfirmed.pk}


def test_resend_leaves_a_row_that_changed_meanwhile(make_session):
    unconfirmed = _outbound(make_session, DeliveryStatus.UNCONFIRMED, "no_echo")
    # The echo comes late: the platform had it after all.
    assert outbound_receipt_apply(platform="qq", echo=str(unconfirmed.uid), actual_id="777")
    assert messages_resend(message_ids=[unconfirmed.pk], by="test") == []
    failed = _outbound(make_session, DeliveryStatus.FAILED, "adapter_offline")
    assert [m.pk for m in messages_resend(message_ids=[failed.pk], by="a")] == [failed.pk]
    assert messages_resend(message_ids=[failed.pk], by="b") == []  # a second operator: already back
    assert len(Message.objects.get(pk=failed.pk).extra["resends"]) == 1


def test_resend_from_the_scheduled_messages_admin_records_it_in_the_history(api, make_session):  # noqa: F811
    task_id, message = api_send_now(api, make_session())
    put(message, DeliveryStatus.FAILED, DeliveryError.INTERRUPTED)
    other_id, _ = api_send_now(api, make_session())  # in the outbox: nothing to resend
    client = _staff("scheduling.view_scheduledmessage", "chat.resend_message")
    post = {"action": "resend_selected", ACTION_CHECKBOX_NAME: [task_id, other_id], "index": 0}
    page = client.post(SCHEDULED, post, follow=True).content.decode()
    assert "Resent 1 scheduled message(s)." in page and "only unconfirmed or failed ones resend" in page
    assert api.get(f"/messages/{task_id}").json()["status"] == "sending"
    event = ScheduledMessage.objects.get(pk=task_id).history[-1]
    assert (event["event"], event["previous"], event["error"]) == ("resent", "failed", "delivery_interrupted")


# --- adapter platforms and query counts -----------------------------------------------------------


def test_adapter_platform_admin_shows_echoes_and_per_platform_counts(operator, make_session):
    now = timezone.now()
    AdapterPlatform.objects.create(
        platform="qq", first_echo_at=now, last_echo_at=now, accept_format=["text", "image"], bot_account="123456"
    )
    AdapterPlatform.objects.create(platform="wechat", no_echo_at=now)  # shown never to echo
    AdapterPlatform.objects.create(platform="line")  # has shown neither yet (chat.delivery_gate)
    for status, n in ((DeliveryStatus.DELIVERED, 3), (DeliveryStatus.UNCONFIRMED, 2), (DeliveryStatus.FAILED, 1)):
        for _ in range(n):
            _outbound(make_session, status)
    _outbound(lambda: make_session(platform="wechat"), DeliveryStatus.FAILED)

    page = operator.get(PLATFORMS).content.decode()
    qq, wechat = row(page, ">qq<"), row(page, ">wechat<")
    assert "123456" in qq and "image" in qq and 'alt="True"' in qq
    assert 'alt="False"' in wechat and 'alt="None"' in row(page, ">line<")
    cells = lambda line: [int(n) for n in re.findall(r'<a href="[^"]*delivery=\w+[^"]*">(\d+)</a>', line)]  # noqa: E731
    assert cells(qq) == [3, 2, 1]
    assert cells(wechat) == [0, 0, 1]
    # The admin stays read-only.
    assert operator.get(reverse("admin:chat_adapterplatform_add")).status_code == 403


def _queries(client: Client, url: str, params: dict | None = None, headers: dict | None = None) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url, params or {}, headers=headers).status_code == 200
    return len(ctx.captured_queries)


def test_lists_cost_the_same_queries_for_two_rows_or_twelve(api, operator, make_session):  # noqa: F811
    AdapterPlatform.objects.create(platform="qq")

    def add(n):
        for i in range(n):
            session = make_session()
            _, message = api_send_now(api, session)
            put(message, CASES[i % len(CASES)][0], CASES[i % len(CASES)][2])
            image = {"conversation_id": session.session_id, "type": "image", "image": {"base64": png_base64()}}
            assert api.post("/messages", image).status_code == 201
        AdapterPlatform.objects.get_or_create(platform=f"p{AdapterPlatform.objects.count()}")

    surfaces = [
        (api.client, "/api/v1/messages", {"limit": 100}, {"Authorization": f"Bearer {api.raw_token}"}),
        (operator, SCHEDULED, None, None),
        (operator, MESSAGES, None, None),
        (operator, PLATFORMS, None, None),
        (operator, DASHBOARD, None, None),
    ]
    add(1)
    small = [_queries(*surface) for surface in surfaces]
    add(5)
    large = [_queries(*surface) for surface in surfaces]
    assert large == small
