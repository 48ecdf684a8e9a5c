"""The dashboard that refreshes itself: its panels fragment (/admin/console/panels/) renders what the page
shows, to whom the page shows it and to nobody else; and the problems listed first, each with what to do."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from chat.models import AdapterConnection, DeliveryStatus, LLMCall, Message
from chat.services import message_send
from core import config as bot_config
from core.models import LogEntry, ProcessHeartbeat
from scheduling.services import SYSTEM, scheduled_message_create

pytestmark = pytest.mark.django_db

PANELS = "/admin/console/panels/"
SECRET_CHAT = "秘密群聊"  # a chat name only an operator may read


@pytest.fixture
def secret_chat(make_session):
    session = make_session(user_nickname=SECRET_CHAT)
    message_send(session=session, source_kind="admin", text="hello")
    scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(hours=1), message_text="提醒", acted_by=SYSTEM
    )
    return session


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("staff", password="pw-123456", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return logged_in(User.objects.get(pk=user.pk))


def live_block(page: str) -> str:
    """The panels as the dashboard page embeds them."""
    inner = page.split('id="dashboard-live"', 1)[1].split(">", 1)[1]
    return inner.split("</div>\n<script>", 1)[0]


def same_minute(html: str) -> str:
    return re.sub(r"\b\d\d:\d\d\b", "HH:MM", html).strip()


def test_nobody_without_the_console_permission_gets_the_panels(secret_chat):
    anonymous = Client().get(PANELS)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    assert SECRET_CHAT not in anonymous.content.decode()

    member = User.objects.create_user("member", password="pw-123456")  # active, not staff
    response = logged_in(member).get(PANELS)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert SECRET_CHAT not in response.content.decode()

    no_console = staff("view_scheduledmessage", "view_message")  # may see admin lists, not the console
    response = no_console.get(PANELS)
    assert response.status_code == 403
    assert SECRET_CHAT not in response.content.decode() and "problems" not in response.content.decode()
    assert no_console.get("/admin/console/").status_code == 403  # as the dashboard itself


def test_a_console_viewer_gets_exactly_the_dashboards_panels(secret_chat):
    viewer = staff("view_console")
    fragment = viewer.get(PANELS)
    assert fragment.status_code == 200
    assert "no-cache" in fragment["Cache-Control"] and "private" in fragment["Cache-Control"]
    body = fragment.content.decode()
    assert SECRET_CHAT in body and 'id="problems"' in body
    assert "<html" not in body and "csrfmiddlewaretoken" not in body and 'id="header"' not in body
    assert same_minute(body) == same_minute(live_block(viewer.get("/admin/console/").content.decode()))
    # No link to pages this viewer may not open: the scheduled message's page, the messages list.
    assert "/admin/scheduling/scheduledmessage/" not in body and "/admin/chat/message/" not in body
    assert viewer.post(PANELS).status_code == 405


def test_the_panels_show_a_message_stored_since_the_page_was_loaded(admin_client, make_session):
    before = admin_client.get(PANELS).content.decode()
    assert "新朋友" not in before
    message_send(session=make_session(user_nickname="新朋友"), source_kind="admin", text="你好")
    after = admin_client.get(PANELS).content.decode()
    chats = after.split('id="chats"', 1)[1].split('class="module"', 1)[0]
    assert "新朋友" in chats


def test_the_page_refreshes_at_the_pace_asked_within_bounds(admin_client):
    def pace(query: str = "") -> str:
        page = admin_client.get("/admin/console/" + query).content.decode()
        return re.search(r'data-refresh-url="/admin/console/panels/" data-refresh-seconds="(\d+)"', page).group(1)

    assert pace() == "15"
    assert pace("?refresh=2") == "2"
    assert pace("?refresh=0") == "1"
    assert pace("?refresh=soon") == "15"


def test_problems_come_first_each_with_what_to_do(admin_client, make_session):
    now = timezone.now()
    failed = message_send(session=make_session(), source_kind="admin", text="lost")
    Message.objects.filter(pk=failed.pk).update(delivery_status=DeliveryStatus.FAILED)
    LogEntry.objects.create(
        created_at=now,
        level=30,
        level_name="WARNING",
        logger="chat.gateway.auth",
        module="auth",
        line=155,
        message="legacy adapter connection from 10.0.0.5 (platform 'qq') refused: no token",
        process="web",
    )
    with bot_config.override(llm={"model": "deepseek-chat", "base_url": "http://127.0.0.1:9/v1"}):
        LLMCall.objects.create(purpose="planner", model="deepseek-chat", model_name="default", error="HTTP 401: no")
        page = admin_client.get("/admin/console/").content.decode()
    assert page.index('id="problems"') < page.index('id="health"')
    problems = page.split('id="problems"', 1)[1].split('class="console-grid"', 1)[0]
    kinds = re.findall(r'class="problem problem-(\w+)"', problems)
    assert kinds == ["model", "cluster", "refused", "adapter", "delivery"]
    assert "HTTP 401: no" in problems and 'href="/admin/models/"' in problems
    assert "The task cluster is not running" in problems and 'href="/admin/logs/"' in problems
    assert "1 adapter connection was refused in the last hour." in problems
    assert problems.count('href="/admin/connect/"') == 2
    assert "1 failed, 0 unconfirmed" in problems and 'href="/admin/chat/message/?delivery=failed"' in problems

    AdapterConnection.objects.create(platform="qq", protocol="ws")
    ProcessHeartbeat.objects.create(name="host:1", role="cluster", started_at=now, beat_at=now)
    Message.objects.filter(pk=failed.pk).delete()
    LogEntry.objects.all().delete()
    calm = admin_client.get("/admin/console/").content.decode().split('id="problems"', 1)[1]
    assert "No problem found." in calm.split('class="console-grid"', 1)[0]
