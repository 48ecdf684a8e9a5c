"""The transcript page in headless Chromium against a real daphne, in Simplified Chinese and in English, on a
phone-sized screen: the conversation as bubbles oldest first, the operator's message sent from the box and
its fate shown, nothing wider than the screen (screenshots of both)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from chat.models import DeliveryStatus, Direction, Message, SourceKind
from chat.services import session_get_or_create
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

TEXTS = {
    "zh-CN": {
        "login": "登录", "send": "发送", "box": "在这个聊天里发言", "pending": "待发送", "delivered": "已送达",
        "zone": "机器人的时区", "operator": "运营者 op",
    },
    "en-US": {
        "login": "Log in", "send": "Send", "box": "Write into this chat", "pending": "Pending",
        "delivered": "Delivered", "zone": "the bot's time zone", "operator": "Operator op",
    },
}  # fmt: skip


def orm(fn):
    """Run ORM code from inside the test (Playwright's loop runs in this thread) on a thread of its own."""

    def run():
        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


@pytest.fixture
def chat(transactional_db):
    User.objects.create_superuser("op", password="pw-123456")
    session = session_get_or_create(platform="qq", chat_type="private", user_id="4242", user_nickname="小红")
    t0 = timezone.now() - timedelta(minutes=5)
    Message.objects.create(
        session=session, direction=Direction.IN, source_kind=SourceKind.USER, sender_id="4242",
        sender_nickname="小红", text="明天早上8点提醒我 <b>交报告</b>", time=t0,
    )  # fmt: skip
    Message.objects.create(
        session=session, direction=Direction.OUT, source_kind=SourceKind.REPLY, text="好的，我会提醒你。" * 8,
        time=t0 + timedelta(seconds=3), delivery_status=DeliveryStatus.DELIVERED, sent_at=t0, delivered_at=t0,
    )  # fmt: skip
    return session


@pytest.mark.parametrize("language", TEXTS)
def test_the_transcript_reads_and_sends_in_the_browsers_language(shared_server, chat, browser, tmp_path, language):
    _, base = shared_server
    texts = TEXTS[language]
    context = browser.new_context(viewport={"width": 390, "height": 844}, locale=language)
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{base}/admin/login/?next=/admin/chats/{chat.pk}/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-123456")
    page.click(f"input[type=submit][value='{texts['login']}']")
    page.wait_for_url(f"{base}/admin/chats/{chat.pk}/")

    assert page.locator(".bubble .text").all_inner_texts() == [
        "明天早上8点提醒我 <b>交报告</b>",
        "好的，我会提醒你。" * 8,
    ]
    assert page.inner_text(".bubble.out .fate") == texts["delivered"]
    assert texts["zone"] in page.inner_text("#transcript-zone")
    assert page.inner_text("#send-box h2") == texts["box"]

    page.fill("#send-box textarea", "运营者来啦 operator here")
    page.click("#send-button")
    page.wait_for_selector(".bubble.out >> nth=1")
    last = page.locator(".bubble.out").last
    assert last.locator(".text").inner_text() == "运营者来啦 operator here"
    assert last.locator(".who").inner_text() == texts["operator"]
    assert last.locator(".fate").inner_text() == texts["pending"]  # no adapter connected: it waits in the outbox
    sent = orm(lambda: Message.objects.get(session=chat, source_kind=SourceKind.ADMIN))
    assert sent.delivery_status == DeliveryStatus.PENDING

    # Nothing is wider than the phone's screen: long text wraps inside its bubble.
    wide = page.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
        ".map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), wide
    shot = tmp_path / f"transcript-{language}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, f"/tmp/maibot-console-transcript-{language}.png")

    orm(
        lambda: Message.objects.filter(pk=sent.pk).update(
            delivery_status=DeliveryStatus.DELIVERED, sent_at=timezone.now(), delivered_at=timezone.now()
        )
    )
    page.reload()
    assert wait_for(lambda: page.locator(".bubble.out .fate").last.inner_text() == texts["delivered"], timeout=5)
    context.close()
