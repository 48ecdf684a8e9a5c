"""A chat's transcript page and the operator's send box (console.transcript): the conversation oldest first in
the bot's time zone with each bot message's fate, "load earlier" pages, and a send that takes the one send
path; attacked as a viewer without the send permission, without a CSRF token, through a forged Host, and
with HTML in messages."""

from __future__ import annotations

import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat.models import DeliveryStatus, Direction, Message, SourceKind
from chat.services import outbound_created
from core import config as bot_config

pytestmark = pytest.mark.django_db

BOT_ZONE = "America/New_York"


@pytest.fixture
def bot_zone():
    with bot_config.override(bot={"time_zone": BOT_ZONE, "nickname": "麦麦"}):
        yield ZoneInfo(BOT_ZONE)


def said(session, text: str, *, at, out: bool = False, status: str = "", **kw) -> Message:
    return Message.objects.create(
        session=session,
        direction=Direction.OUT if out else Direction.IN,
        source_kind=SourceKind.REPLY if out else SourceKind.USER,
        sender_id="" if out else session.user_id,
        sender_nickname="" if out else session.user_nickname,
        text=text,
        time=at,
        delivery_status=status if out else "",
        **kw,
    )


def bubbles(html: str) -> list[str]:
    return re.findall(r'<div class="text">(.*?)</div>', html, re.S)


def url(session) -> str:
    return reverse("console-transcript", args=[session.pk])


def send_url(session) -> str:
    return reverse("console-transcript-send", args=[session.pk])


def test_the_transcript_shows_who_said_what_oldest_first_in_the_bot_zone_with_each_fate(
    operator, make_session, bot_zone
):
    session = make_session(user_nickname="小明")
    t0 = timezone.now() - timedelta(hours=1)
    said(session, "明天提醒我开会", at=t0)
    said(
        session, "好的", at=t0 + timedelta(seconds=5), out=True, status=DeliveryStatus.DELIVERED, delivered_at=t0,
        sent_at=t0,
    )  # fmt: skip
    said(
        session,
        "没送到",
        at=t0 + timedelta(seconds=9),
        out=True,
        status=DeliveryStatus.FAILED,
        delivery_error="no adapter",
    )
    page = operator.get(url(session))
    assert page.status_code == 200
    html = page.content.decode()
    assert bubbles(html) == ["明天提醒我开会", "好的", "没送到"]
    assert "小明" in html and "麦麦" in html
    shown = t0.astimezone(bot_zone).strftime("%Y-%m-%d %H:%M:%S %z")
    assert shown in html and BOT_ZONE in html  # the offset on each time, the zone's name on the page
    assert re.findall(r'data-fate="(\w+)"', html) == ["delivered", "failed"]
    assert ">Delivered<" in html and ">Failed<" in html and "no adapter" in html
    assert 'id="send-box"' in html  # a superuser may write


def test_load_earlier_pages_back_to_the_first_message(operator, make_session):
    session = make_session()
    t0 = timezone.now() - timedelta(days=1)
    for i in range(120):  # two share each second: the paging follows (time, id), not time alone
        said(session, f"m{i}", at=t0 + timedelta(seconds=i // 2))
    seen: list[str] = []
    link = url(session)
    for expected in (50, 50, 20):
        html = operator.get(link).content.decode()
        texts = bubbles(html)
        assert len(texts) == expected
        seen = texts + seen
        found = re.search(r'id="load-earlier" href="([^"]+)"', html)
        link = url(session) + found.group(1) if found else None
    assert link is None
    assert seen == [f"m{i}" for i in range(120)]


def test_html_in_messages_and_names_is_shown_as_text(operator, make_session):
    session = make_session(user_nickname="<b>bold</b>")
    said(session, "<script>alert(1)</script><img src=x onerror=alert(2)>", at=timezone.now())
    html = operator.get(url(session)).content.decode()
    assert "<script>alert(1)" not in html and "<img src=x" not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;bold&lt;/b&gt;" in html


def test_the_operators_message_takes_the_send_path_and_its_fate_shows(
    operator, make_session, django_capture_on_commit_callbacks
):
    session = make_session()
    announced: list[Message] = []

    def listener(messages, **kwargs):
        announced.extend(messages)

    outbound_created.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            answer = operator.post(send_url(session), {"text": "  您好，我是运营者 <i>  "})
    finally:
        outbound_created.disconnect(listener)
    assert answer.status_code == 302 and answer.url == url(session)
    sent = Message.objects.get(session=session)
    assert (sent.direction, sent.source_kind, sent.delivery_status) == ("out", "admin", "pending")
    assert sent.text == "您好，我是运营者 <i>" and sent.extra == {"operator": "admin"}
    assert [m.pk for m in announced] == [sent.pk]  # the outbox deliverer is woken as for the bot's own
    html = operator.get(url(session)).content.decode()
    assert 'data-fate="pending"' in html and "Operator admin" in html and "&lt;i&gt;" in html

    Message.objects.filter(pk=sent.pk).update(
        delivery_status=DeliveryStatus.DELIVERED, sent_at=timezone.now(), delivered_at=timezone.now()
    )
    assert 'data-fate="delivered"' in operator.get(url(session)).content.decode()


@pytest.mark.parametrize("text", ["", "   ", "\u200b\u200b", "x" * 4001, "a\x00b"])
def test_bad_text_is_refused_with_a_reason_and_nothing_is_sent(operator, make_session, text):
    session = make_session()
    answer = operator.post(send_url(session), {"text": text})
    assert answer.status_code == 400
    assert 'class="errorlist' in answer.content.decode()
    assert not Message.objects.filter(session=session).exists()


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_a_viewer_reads_but_cannot_send(make_session):
    session = make_session()
    viewer = staff("viewer", "view_message", "view_chatsession")
    page = viewer.get(url(session))
    assert page.status_code == 200 and 'id="send-box"' not in page.content.decode()
    assert viewer.post(send_url(session), {"text": "hi"}).status_code == 403
    assert not Message.objects.filter(session=session).exists()


def test_without_the_view_permission_neither_reading_nor_sending(make_session):
    session = make_session()
    sender_only = staff("sender", "send_operator_message")
    assert sender_only.get(url(session)).status_code == 403
    assert sender_only.post(send_url(session), {"text": "hi"}).status_code == 403
    assert not Message.objects.filter(session=session).exists()
    assert Client().post(send_url(session), {"text": "hi"}).status_code == 302  # to the login
    assert not Message.objects.filter(session=session).exists()


def test_a_send_without_the_csrf_token_is_refused(make_session):
    session = make_session()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(User.objects.create_superuser("boss", password="pw-123456"))
    assert browser.post(send_url(session), {"text": "hi"}).status_code == 403
    form = browser.get(url(session)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    assert browser.post(send_url(session), {"text": "hi", "csrfmiddlewaretoken": token}).status_code == 302
    assert Message.objects.filter(session=session).count() == 1


def test_a_send_through_a_proxy_with_a_forged_host_is_refused(operator, make_session):
    session = make_session()
    forged = operator.post(
        send_url(session), {"text": "hi"}, HTTP_HOST="rebind.evil.example", HTTP_X_FORWARDED_HOST="127.0.0.1"
    )
    assert forged.status_code == 400
    forwarded = operator.post(
        send_url(session), {"text": "hi"}, HTTP_HOST="127.0.0.1", HTTP_X_FORWARDED_HOST="rebind.evil.example"
    )
    assert forwarded.status_code == 302  # the forwarded name is not believed: the request is for 127.0.0.1
    assert Message.objects.filter(session=session).count() == 1


def test_the_session_admin_and_the_dashboard_link_to_the_transcript(operator, make_session):
    session = make_session()
    said(session, "hello", at=timezone.now())
    link = f'href="{url(session)}"'
    assert link in operator.get(reverse("admin:chat_chatsession_change", args=[session.pk])).content.decode()
    assert link in operator.get(reverse("admin:chat_chatsession_changelist")).content.decode()
    assert link in operator.get(reverse("console-dashboard")).content.decode()
