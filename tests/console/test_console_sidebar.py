"""The console's sidebar (console.site.ConsoleSite): the bot's pages first, each only to whom may open it,
in the operator's language; django-q2's internals listed nowhere."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

pytestmark = [pytest.mark.django_db, pytest.mark.backend_independent]

ZH = "zh-CN,zh;q=0.9"
EN = "en-US,en;q=0.9"
ALL = ["dashboard", "chats", "scheduled", "timers", "plugins", "models", "config", "logs", "api", "connect"]
# Each page a user may open with only one permission, and what else that permission shows.
ONE_PERMISSION = {
    "maibot.view_console": ["dashboard", "plugins", "logs", "connect"],
    "chat.view_chatsession": ["chats"],
    "scheduling.view_scheduledmessage": ["scheduled"],
    "scheduling.change_timer": ["timers"],
    "maibot.test_llm_models": ["models"],
    "maibot.change_config": ["config"],
    "chat.view_apitoken": ["api"],
}
ENTRY = re.compile(r'<th scope="row" id="console-(\w+)">\s*<a href="([^"]+)"[^>]*>([^<]+)</a>')


def _sidebar(client: Client, url: str, language: str = EN) -> list[tuple[str, str, str]]:
    page = client.get(url, HTTP_ACCEPT_LANGUAGE=language)
    assert page.status_code == 200, (url, page.status_code)
    html = page.content.decode()
    start = html.index('<nav class="sticky" id="nav-sidebar"')
    nav = html[start : html.index("</nav>", start)]
    return [(key, href, name.strip()) for key, href, name in ENTRY.findall(nav)]


def _staff_with(perm: str) -> Client:
    user = User.objects.create_user(f"u-{perm}", password="pw-123456", is_staff=True)
    app_label, codename = perm.split(".")
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_an_operator_sees_the_bots_pages_first_in_order_in_either_language(admin_client):
    for url in (reverse("console-dashboard"), reverse("admin:chat_message_changelist")):
        entries = _sidebar(admin_client, url)
        assert [key for key, _, _ in entries] == ALL
        names = {key: name for key, _, name in entries}
        assert names["scheduled"] == "Scheduled" and names["api"] == "API &amp; MCP"
        zh = {key: name for key, _, name in _sidebar(admin_client, url, ZH)}
        assert zh["dashboard"] == "仪表盘" and zh["chats"] == "聊天" and zh["config"] == "配置"
        assert zh["api"] == "API 与 MCP"
        for key, href, _ in entries:
            assert admin_client.get(href, HTTP_ACCEPT_LANGUAGE=EN).status_code == 200, (key, href)


@pytest.mark.parametrize("perm", ONE_PERMISSION)
def test_a_user_with_one_permission_is_shown_exactly_the_pages_it_opens(perm):
    client = _staff_with(perm)
    url = reverse("admin:password_change")  # a page every staff user may open
    entries = _sidebar(client, url)
    assert [key for key, _, _ in entries] == ONE_PERMISSION[perm]
    shown = {key for key, _, _ in entries}
    everything = {key: href for key, href, _ in _sidebar(_superuser_client(), url)}
    for key, href in everything.items():
        status = client.get(href).status_code
        assert (status == 200) == (key in shown), (perm, key, href, status)


def _superuser_client() -> Client:
    user = User.objects.filter(is_superuser=True).first() or User.objects.create_superuser("root", password="pw-1")
    client = Client()
    client.force_login(user)
    return client


def test_a_user_with_no_console_permission_gets_no_console_section():
    user = User.objects.create_user("plain", password="pw-123456", is_staff=True)
    client = Client()
    client.force_login(user)
    assert _sidebar(client, reverse("admin:password_change")) == []


def test_the_task_queues_internals_are_listed_nowhere_and_its_schedules_not_served(admin_client):
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert "/admin/django_q/" not in index
    assert 'class="app-django_q' not in index
    sidebar = admin_client.get(reverse("console-dashboard")).content.decode()
    assert "/admin/django_q/" not in sidebar
    # A schedule row would never run (the dispatcher is the scheduler); the queue's rows are its own.
    assert admin_client.get("/admin/django_q/schedule/").status_code == 404
    assert admin_client.get("/admin/django_q/ormq/").status_code == 404
    # A failed task's record stays reachable for whoever is sent there, breadcrumbs included.
    assert admin_client.get(reverse("admin:django_q_failure_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:app_list", args=["django_q"])).status_code == 200
