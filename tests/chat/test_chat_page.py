"""The operator chat page in headless Chromium against a live daphne: send, stored, replies arrive live.

No model is configured in the server, so the offline planner answers the operator's message (after the
chat's debounce): the test waits for that answer before it sends messages of its own, so the order of
the bot's messages on the page is known.
"""

from __future__ import annotations

import os
import shutil

import pytest
from django.contrib.auth import get_user_model

from chat.models import ChatSession, Message, SourceKind
from chat.offline import _notice
from chat.services import message_send
from tests.conftest import CHROMIUM_ARGS, db, require_chromium, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]


@pytest.fixture
def operator(transactional_db):
    return get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)


async def test_operator_chats_with_the_bot_and_sees_replies_live(shared_server, operator, tmp_path):
    from playwright.async_api import async_playwright, expect

    _, base = shared_server
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{base}/chat/")
            # Login required: the admin login form, then back to the chat page.
            await page.fill("#id_username", "operator")
            await page.fill("#id_password", "s3cret-pass")
            await page.click("input[type=submit]")
            await page.wait_for_url(f"{base}/chat/")
            await expect(page.locator("#status")).to_have_text("connected")

            await page.fill("#text", "你好, bot! hello")
            await page.keyboard.press("Enter")
            stored = await wait_for_async(
                lambda: Message.objects.filter(direction="in").first(), what="the page's message"
            )
            assert stored.text == "你好, bot! hello" and stored.source_kind == "user"
            session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
            assert (session.platform, session.chat_type, session.user_id) == ("web", "private", str(operator.pk))
            await expect(page.locator(".msg.in .bubble")).to_have_text(["你好, bot! hello"])

            # The planner's own answer (offline: the notice) is stored and shown live.
            answer = await wait_for_async(
                lambda: Message.objects.filter(session_id=session.pk, direction="out").first(), what="the bot's answer"
            )
            assert (answer.source_kind, answer.text) == (SourceKind.REPLY, _notice())
            await expect(page.locator(".msg.out .bubble")).to_have_text([answer.text])

            # A reply and a scheduled message, queued through the send service, arrive live after it.
            reply = await db(message_send, session=session, source_kind="reply", text="Hi operator, 我在。")
            await expect(page.locator(".msg.out .bubble")).to_have_text([answer.text, "Hi operator, 我在。"])
            await db(message_send, session=session, source_kind="scheduled_send", text="Your reminder ⏰")
            await expect(page.locator(".msg.out .bubble")).to_have_text(
                [answer.text, "Hi operator, 我在。", "Your reminder ⏰"]
            )
            await expect(page.locator(".msg.out .meta").nth(2)).to_contain_text("scheduled send")
            await wait_for_async(lambda: Message.objects.filter(pk=reply.pk, delivery_status="sent").exists())

            # History survives a reload: the operator's message and the bot's three.
            await page.reload()
            await expect(page.locator(".bubble")).to_have_count(4)
            shot = tmp_path / "chat-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("MAIBOT_KEEP_SCREENSHOT"):
                shutil.copy(shot, os.environ["MAIBOT_KEEP_SCREENSHOT"])
        finally:
            await browser.close()


async def test_the_chat_page_and_its_socket_need_a_staff_login(shared_server):
    import websockets

    _, base = shared_server
    import urllib.request

    with urllib.request.urlopen(f"{base}/chat/", timeout=10) as resp:
        assert "/admin/login/" in resp.url
    with pytest.raises(websockets.InvalidStatus):
        async with websockets.connect(base.replace("http", "ws") + "/chat/ws/", origin=base):
            pass
