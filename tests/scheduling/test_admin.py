"""Operators manage scheduled messages through the admin pages; every action goes through the
services and records who did it."""

import re
from datetime import timedelta
from html import unescape as html_unescape

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from chat.services import message_send
from core import config
from scheduling import dispatcher
from scheduling.models import Actor, ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:scheduling_scheduledmessage_changelist")


@pytest.fixture
def operator(admin_user, client):
    client.force_login(admin_user)
    return admin_user


def schedule(session, hours=1.0, text="hello"):
    return scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(hours=hours), message_text=text, acted_by=SYSTEM
    ).task


def act(client, action, tasks, **extra):
    return client.post(
        CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: [t.pk for t in tasks], **extra}, follow=True
    )


def test_changelist_shows_badges_filters_and_search(client, operator, make_session):
    session = make_session(user_nickname="小明")
    schedule(session, text="喝水提醒 drink water")
    page = client.get(CHANGELIST)
    html = page.content.decode()
    assert page.status_code == 200
    assert "mb-badge" in html and "Pending" in html
    assert "喝水提醒 drink water" in html
    for filt in ("status", "chat_type", "platform", "created_via"):
        assert client.get(CHANGELIST, {filt: "x" if filt == "platform" else "pending"}).status_code == 200
    found = client.get(CHANGELIST, {"q": "小明"}).content.decode()
    assert "喝水提醒" in found
    assert "喝水提醒" not in client.get(CHANGELIST, {"q": "nobody-here"}).content.decode()


def test_cancel_selected_cancels_pending_and_records_the_operator(client, operator, make_session):
    pending, sent = schedule(make_session()), schedule(make_session())
    ScheduledMessage.objects.filter(pk=sent.pk).update(status=ScheduledStatus.CANCELLED, cancelled_at=timezone.now())
    page = act(client, "cancel_selected", [pending, sent])
    assert "Cancelled 1 scheduled message" in page.content.decode()
    assert "Skipped" in page.content.decode()
    pending.refresh_from_db()
    assert pending.status == ScheduledStatus.CANCELLED
    assert pending.cancelled_via == Actor.OPERATOR and pending.cancelled_by_user == operator
    assert pending.history[-1]["by"] == f"operator:{operator.username}"


def test_reschedule_shows_an_intermediate_page_in_the_bot_time_zone(client, operator, make_session):
    task = schedule(make_session())
    page = act(client, "reschedule_selected", [task])
    assert page.status_code == 200
    assert "Asia/Shanghai" in page.content.decode() and 'name="send_at"' in page.content.decode()

    past = act(client, "reschedule_selected", [task], apply="1", send_at="2020-01-01 08:00")
    assert "in the past" in past.content.decode()
    task.refresh_from_db()
    old_send_at = task.send_at

    local = (timezone.now() + timedelta(days=3)).astimezone(config.get_config().tzinfo).replace(microsecond=0)
    typed = local.strftime("%Y-%m-%d %H:%M:%S")
    preview = act(client, "reschedule_selected", [task], apply="1", send_at=typed)
    assert local.strftime("%Y-%m-%d %H:%M:%S %z") in preview.content.decode()  # resolved, not yet applied
    task.refresh_from_db()
    assert task.send_at == old_send_at
    done = act(client, "reschedule_selected", [task], apply="1", confirm="1", send_at=typed)
    assert "Rescheduled" in done.content.decode()
    task.refresh_from_db()
    assert task.send_at == local != old_send_at
    assert task.due_at == local
    assert task.rescheduled_by_user == operator
    assert task.history[-1]["event"] == "rescheduled"


def test_send_now_makes_it_due_and_the_dispatcher_sends_it(client, operator, make_session):
    task = schedule(make_session(), hours=5, text="now please")
    act(client, "send_now_selected", [task])
    dispatcher.deliver_due()
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT
    assert task.sent_message.text == "now please"


def test_retry_failed_puts_it_back_and_it_is_sent(client, operator, make_session):
    task = schedule(make_session())
    ScheduledMessage.objects.filter(pk=task.pk).update(status=ScheduledStatus.FAILED, last_error="boom", attempts=5)
    page = act(client, "retry_failed_selected", [task])
    assert "Retrying 1" in page.content.decode()
    task.refresh_from_db()
    assert (task.status, task.attempts, task.last_error) == (ScheduledStatus.PENDING, 0, "")
    dispatcher.deliver_due()
    task.refresh_from_db()
    assert task.status == ScheduledStatus.SENT


def test_ids_that_look_like_admin_escapes_open_from_the_list(client, operator, make_session):
    # The admin escapes "_" in URLs ("sm_..." becomes "sm_5F..."); an unescaped "sm_22..." would read as '"'.
    task = schedule(make_session(), text="escape me")
    ScheduledMessage.objects.filter(pk=task.pk).update(id="sm_22k3v9xq2m")
    html = client.get(CHANGELIST).content.decode()
    link = re.search(r'href="([^"]*/sm_5F22k3v9xq2m/change/[^"]*)"', html).group(1)
    page = client.get(html_unescape(link))
    assert page.status_code == 200 and "escape me" in page.content.decode()


def test_change_form_edits_pending_only(client, operator, make_session):
    task = schedule(make_session(), text="before")
    url = reverse("admin:scheduling_scheduledmessage_change", args=[quote(task.pk)])
    form = client.get(url)
    assert form.status_code == 200 and 'name="message_text"' in form.content.decode()
    when = (timezone.now() + timedelta(days=1)).astimezone(config.get_config().tzinfo).replace(microsecond=0)
    client.post(url, {"message_text": "after", "send_at": when.strftime("%Y-%m-%d %H:%M:%S")})
    task.refresh_from_db()
    assert (task.message_text, task.send_at) == ("after", when)
    assert [e["event"] for e in task.history][-2:] == ["rescheduled", "edited"]

    bad = client.post(url, {"message_text": "   ", "send_at": "yesterday"})
    assert bad.status_code == 200 and "errorlist" in bad.content.decode()
    task.refresh_from_db()
    assert task.message_text == "after"

    ScheduledMessage.objects.filter(pk=task.pk).update(status=ScheduledStatus.CANCELLED, cancelled_at=timezone.now())
    view = client.get(url).content.decode()
    assert 'name="message_text"' not in view  # read-only now
    client.post(url, {"message_text": "sneaky", "send_at": when.strftime("%Y-%m-%d %H:%M:%S")})
    task.refresh_from_db()
    assert task.message_text == "after"


def test_conversation_is_readable_in_order(client, operator, make_session):
    from chat.models import Direction, Message, SourceKind

    session = make_session(user_nickname="Alice")
    Message.objects.create(
        session=session,
        direction=Direction.IN,
        source_kind=SourceKind.USER,
        text="第一条 first",
        sender_id=session.user_id,
        sender_nickname="Alice",
        time=timezone.now() - timedelta(minutes=1),
    )
    message_send(session=session, source_kind=SourceKind.REPLY, text="second reply")
    html = client.get(reverse("admin:chat_chatsession_change", args=[session.pk])).content.decode()
    assert html.index("第一条 first") < html.index("second reply")
    listing = client.get(reverse("admin:chat_message_changelist"), {"session__id__exact": session.pk})
    assert listing.status_code == 200 and "second reply" in listing.content.decode()


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("明天早上8点", lambda now, tz: (now.astimezone(tz) + timedelta(days=1)).replace(hour=8, minute=0, second=0)),
        ("in 2 hours", lambda now, tz: now + timedelta(hours=2)),
        ("2小时后", lambda now, tz: now + timedelta(hours=2)),
        ("2030-12-24T08:00:00-05:00", lambda now, tz: timezone.datetime.fromisoformat("2030-12-24T08:00:00-05:00")),
    ],
)
def test_reschedule_reads_what_people_type_with_the_bots_own_parser(client, operator, make_session, typed, expected):
    task = schedule(make_session())
    tz = config.get_config().tzinfo
    with config.override(scheduling={"horizon_days": 3650}):
        before = timezone.now()
        preview = act(client, "reschedule_selected", [task], apply="1", send_at=typed).content.decode()
        want = expected(before, tz).replace(microsecond=0)
        resolved = re.search(r'id="reschedule-resolved">.*?<strong>([^<]+)</strong> \(([^)]+)\)', preview)
        assert resolved.group(2) == str(tz)
        shown = timezone.datetime.strptime(resolved.group(1), "%Y-%m-%d %H:%M:%S %z")
        assert abs((shown - want).total_seconds()) <= 5
        iso = re.search(r'name="send_at" value="([^"]+)"', preview[preview.index("reschedule-confirm") :]).group(1)
        assert iso.endswith(shown.astimezone(tz).isoformat()[-6:])  # exchanged with its offset
        task.refresh_from_db()
        assert task.status == ScheduledStatus.PENDING and task.history[-1]["event"] == "created"  # not yet
        done = act(client, "reschedule_selected", [task], apply="1", confirm="1", send_at=iso).content.decode()
    task.refresh_from_db()
    assert task.send_at == shown
    assert html_unescape(f"Rescheduled to {resolved.group(1)} ({tz})") in html_unescape(done)


@pytest.mark.parametrize("typed", ["下辈子", "next blue moon", "2020-01-01T08:00+08:00", "in 0 minutes", ""])
def test_an_unreadable_or_past_reschedule_says_why_and_changes_nothing(client, operator, make_session, typed):
    task = schedule(make_session())
    for extra in ({}, {"confirm": "1"}):  # a forged confirmation is checked the same way
        page = act(client, "reschedule_selected", [task], apply="1", send_at=typed, **extra).content.decode()
        assert 'class="errorlist' in page and "reschedule-confirm" not in page
    assert (
        "not a time I understand"
        in act(client, "reschedule_selected", [task], apply="1", send_at="下辈子").content.decode()
    )
    assert (
        "in the past"
        in act(client, "reschedule_selected", [task], apply="1", send_at="2020-01-01T08:00+08:00").content.decode()
    )
    fresh = ScheduledMessage.objects.get(pk=task.pk)
    assert (fresh.send_at, fresh.history) == (task.send_at, task.history)
