"""knowledge.search through the real maibot-plugin-sdk's PluginContext over the knowledge store the
operator fills in the admin: MaiBot 1.3's content strings, Chinese found by its words without a
segmenter, edits found at once, disabled entries never; a viewer cannot write the store."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Permission, User

from chat.models import KnowledgeEntry
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)


def add(client, title: str, content: str, enabled: bool = True) -> KnowledgeEntry:
    data = {"title": title, "content": content, **({"enabled": "on"} if enabled else {})}
    assert client.post("/admin/chat/knowledgeentry/add/", data).status_code == 302
    return KnowledgeEntry.objects.get(title=title)


def test_the_operators_entries_are_found_as_maibot_answers(client):
    client.force_login(User.objects.create_superuser("op", password="pw"))
    add(client, "群规", "本群禁止发广告，违者踢出。每周五晚上八点有狼人杀活动。")
    add(client, "天气", "明天北京有小雨，气温 12 到 18 度。")
    add(client, "Opening hours", "The library opens at 9am and closes at 6pm on weekdays.")
    secret = add(client, "草稿", "狼人杀活动取消了", enabled=False)
    _, ctx = plugin("test.core.knower", ["knowledge.search"])

    found = run(ctx.knowledge.search("明天天气怎么样", limit=1))
    assert found == "你知道这些知识: 1. 天气: 明天北京有小雨，气温 12 到 18 度。"
    werewolf = run(ctx.knowledge.search("狼人杀什么时候"))
    assert werewolf.startswith("你知道这些知识: 1. 群规: ") and "取消" not in werewolf
    assert run(ctx.knowledge.search("when does the library open?")).startswith("你知道这些知识: 1. Opening hours")
    assert run(ctx.knowledge.search("量子力学")) == "你不太了解有关量子力学的知识"

    url = f"/admin/chat/knowledgeentry/{secret.pk}/change/"
    assert client.post(url, {"title": "草稿", "content": "量子力学入门讲座", "enabled": "on"}).status_code == 302
    assert run(ctx.knowledge.search("量子力学")) == "你知道这些知识: 1. 草稿: 量子力学入门讲座"


def test_arguments_a_viewer_and_an_undeclared_plugin(client):
    KnowledgeEntry.objects.create(title="t", content="hello world")
    _, ctx = plugin("test.core.knower", ["knowledge.search"])
    assert run(ctx.knowledge.search("")) == {"success": False, "error": "缺少必要参数 query"}
    assert run(ctx.call_capability("knowledge.search", query="hello", limit="many")).startswith("你知道这些知识")

    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_knowledgeentry"))
    client.force_login(viewer)
    assert client.post("/admin/chat/knowledgeentry/add/", {"title": "x", "content": "y"}).status_code == 403
    assert KnowledgeEntry.objects.count() == 1

    _, nosy = plugin("test.core.nosy", ["llm.generate"])
    with pytest.raises(RuntimeError, match=re.escape("knowledge.search is not declared")):
        run(nosy.knowledge.search("hello"))
