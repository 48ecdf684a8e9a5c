"""Spend per feature on the dashboard (per task, top chats, cached tokens, budgets against their caps)
and the budget-reached banner on every admin page."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from chat.agent import budget
from chat.models import LLMCall, LLMSpend
from core import config


@pytest.fixture
def operator(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return client


def spend(**fields) -> LLMCall:
    defaults = {"model": "m-1", "model_name": "main", "prompt_tokens": 100, "completion_tokens": 20}
    return LLMCall.objects.create(**{**defaults, **fields})


def section(page: str, ident: str) -> str:
    return page.split(f'id="{ident}"', 1)[1].split("</table>", 1)[0]


def test_the_dashboard_shows_spend_per_task_and_top_chats_with_cached_tokens(operator, make_session):
    chats = [make_session(user_nickname=f"chatter{i}") for i in range(12)]
    for i, chat in enumerate(chats):
        for _ in range(i + 1):  # chatter11 spends most
            spend(purpose="planner", task="planner", session=chat, cached_tokens=40, cost=Decimal("0.001"))
    spend(purpose="summary", task="summary", session=chats[0], cost=Decimal("0.5"))
    spend(purpose="life", task="life")  # no chat
    page = operator.get("/admin/console/").content.decode()

    tasks = section(page, "llm-tasks")
    assert "<td>planner</td><td>78</td><td>0</td><td>7800</td><td>3120</td><td>1560</td><td>0.0780</td>" in tasks
    assert "<td>summary</td><td>1</td>" in tasks and "<td>life</td><td>1</td>" in tasks
    top = section(page, "llm-sessions")
    assert top.count("<tr><td>") == 10
    assert top.index("chatter11") < top.index("chatter10") < top.index("chatter2<")
    assert "chatter1<" not in top and "chatter0<" not in top  # 2 calls each: below the top 10
    assert "<td>12</td><td>1440</td><td>480</td>" in top  # chatter11: 12 calls, tokens, cached
    assert "No budgets configured" in section(page, "llm-budgets")


def test_a_reached_budget_shows_on_the_dashboard_and_as_a_banner_on_admin_pages(operator, monkeypatch):
    budgets = [
        {"scope": "task", "target": "planner", "daily_tokens": 1000},
        {"scope": "task", "target": "life", "daily_cost": 2.5},
    ]
    with config.override(llm={"model": "m-1", "budgets": budgets}):
        page = operator.get("/admin/").content.decode()
        assert 'id="llm-budget-reached"' not in page
        tz = config.get_config().tzinfo
        day = budget.local_day(budget.clock(), tz)
        LLMSpend.objects.create(day=day, scope="task", target="planner", tokens=1200)
        LLMSpend.objects.create(day=day, scope="task", target="life", cost=Decimal("1.25"))
        midnight = config.format_shown(budget.resets_at(day, tz), tz)  # the console's one time format
        for url in ("/admin/", "/admin/console/", "/admin/chat/message/"):
            page = operator.get(url).content.decode()
            banner = page.split('id="llm-budget-reached"', 1)[1].split("</ul>", 1)[0]
            assert f"task planner (1,000 tokens): calls under it wait until {midnight}" in banner
            assert "task life" not in banner
        rows = section(operator.get("/admin/console/").content.decode(), "llm-budgets")
    assert '<tr class="budget-reached"><td>task planner</td><td>1200</td><td>1000</td>' in rows
    assert "<td>task life</td><td>0</td><td>—</td><td>1.2500</td><td>2.5</td><td>under</td>" in rows
