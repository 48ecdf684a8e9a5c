"""A failing model is visible: every console page names it, its failure and since when, until it answers
again; an operator's test call does not count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from chat.models import LLMCall
from core import config
from core.config import format_shown

pytestmark = pytest.mark.django_db

WRONG_KEY = "HTTP 401: Incorrect API key provided"


@pytest.fixture
def a_model():
    with config.override(llm={"model": "deepseek-chat", "base_url": "http://127.0.0.1:9/v1"}):
        yield


def call(minutes_ago: float, error: str = "", purpose: str = "planner") -> LLMCall:
    row = LLMCall.objects.create(purpose=purpose, model="deepseek-chat", model_name="default", error=error)
    LLMCall.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    row.refresh_from_db()
    return row


def banner(client: Client, url: str = "/admin/console/") -> str:
    page = client.get(url).content.decode()
    return page.split('id="model-failing"', 1)[1].split("</ul>", 1)[0] if 'id="model-failing"' in page else ""


def test_a_failing_model_is_named_with_its_status_and_since_when(operator, a_model):
    call(60)
    first = call(30, WRONG_KEY)
    call(10, WRONG_KEY)
    shown = banner(operator)
    since = format_shown(first.created_at, config.get_config().tzinfo)
    assert "“default” (deepseek-chat) is failing: HTTP 401: Incorrect API key provided" in shown
    assert f"Since {since}, 2 calls failed." in shown
    assert "/admin/models/" in shown  # what to do: check and test it
    assert banner(operator, "/admin/") == shown  # on every console page, not only the dashboard


def test_the_banner_goes_when_the_model_answers_again(operator, a_model):
    call(30, WRONG_KEY)
    call(5)
    assert banner(operator) == ""


def test_an_operators_test_call_is_not_the_bots_failure(operator, a_model):
    call(30)
    call(5, WRONG_KEY, purpose="model_test")
    assert banner(operator) == ""


def test_no_banner_without_a_model(operator):
    call(5, WRONG_KEY)
    assert banner(operator) == ""


def test_the_banner_speaks_chinese_to_a_chinese_browser(admin_user, a_model):
    call(30, WRONG_KEY)
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9")
    client.force_login(admin_user)
    shown = banner(client)
    assert "模型“default”（deepseek-chat）调用失败：HTTP 401: Incorrect API key provided。" in shown
    assert "已失败 1 次" in shown and "检查它的密钥和地址，并测试它" in shown
