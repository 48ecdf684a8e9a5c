"""The operator's view of the planner's record: sessions → cycles → prompt, tool calls, tokens and
cost; the usage page; the offline banner."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from chat.models import LLMCall, PlannerCycle, ToolCallRecord
from core import config

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded(make_session):
    session = make_session(user_nickname="Alice")
    now = timezone.now()
    cycle = PlannerCycle.objects.create(
        session=session,
        started_at=now,
        ended_at=now,
        action="reply",
        reasoning="she asked for a reminder",
        trigger="1 new message(s)",
        timings={"total_ms": 12.5, "plan_ms": 10.0},
        prompt=[
            {"role": "system", "content": "你是麦麦 <persona>"},
            {"role": "user", "content": "Alice: remind me in 3 seconds"},
        ],
    )
    ToolCallRecord.objects.create(
        cycle=cycle,
        tool_call_id="call_abc",
        name="schedule_private_message",
        arguments={"send_at": "2026-11-22T09:00:00+08:00", "message_text": "drink water"},
        result={"ok": True, "task_id": "sm_xyz"},
    )
    LLMCall.objects.create(
        cycle=cycle,
        session=session,
        purpose="planner",
        model="fake-model",
        prompt_tokens=1200,
        completion_tokens=80,
        cost=Decimal("0.004200"),
        latency_ms=321,
    )
    LLMCall.objects.create(
        session=session,
        purpose="life",
        model="other-model",
        prompt_tokens=500,
        completion_tokens=20,
        cost=Decimal("0.001000"),
    )
    old = LLMCall.objects.create(purpose="planner", model="fake-model", prompt_tokens=999_999)
    LLMCall.objects.filter(pk=old.pk).update(created_at=now - timedelta(days=90))
    other = PlannerCycle.objects.create(session=session, started_at=now - timedelta(minutes=5), action="no_reply")
    return session, cycle, other


def test_session_page_links_to_its_cycles_in_order(admin_client, recorded):
    session, cycle, other = recorded
    page = admin_client.get(reverse("admin:chat_chatsession_change", args=[session.pk])).content.decode()
    assert "2 cycles" in page
    listing = admin_client.get(
        reverse("admin:chat_plannercycle_changelist"), {"session__id__exact": session.pk, "o": "1"}
    ).content.decode()
    # Oldest first: the no_reply cycle five minutes earlier, then the reply.
    assert listing.index(f"/{other.pk}/change/") < listing.index(f"/{cycle.pk}/change/")


def test_cycle_list_filters_by_action(admin_client, recorded):
    _session, cycle, other = recorded
    listing = admin_client.get(reverse("admin:chat_plannercycle_changelist"), {"action": "no_reply"}).content.decode()
    assert f"/{other.pk}/change/" in listing and f"/{cycle.pk}/change/" not in listing


def test_cycle_page_shows_prompt_tool_calls_and_cost(admin_client, recorded):
    _session, cycle, _other = recorded
    response = admin_client.get(reverse("admin:chat_plannercycle_change", args=[cycle.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    assert "你是麦麦 &lt;persona&gt;" in page  # the rendered prompt, escaped
    assert "Alice: remind me in 3 seconds" in page
    assert "schedule_private_message" in page and "call_abc" in page and "sm_xyz" in page
    assert "1 LLM call: 1200 prompt + 80 completion tokens, cost 0.004200" in page
    assert 'name="_save"' not in page  # read-only


def test_usage_page_sums_per_day_model_and_session_with_an_svg_chart(admin_client, recorded):
    response = admin_client.get(reverse("admin:chat_llmcall_usage"), {"days": 7})
    page = response.content.decode()
    assert response.status_code == 200
    assert "3 calls" not in page and "2 calls, 1700 prompt tokens" in page  # the 90-day-old call is out
    chart = page.split('<div class="usage-chart">', 1)[1].split("</div>", 1)[0]
    assert chart.startswith("<svg") and chart.count("<rect") >= 14 and "<script" not in chart
    assert "http" not in chart.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    assert "1700 prompt, 100 completion tokens" in page  # today's bar tooltip
    assert "other-model" in page and "fake-model" in page and "private Alice" in page
    assert "0.005200" in page
    month = admin_client.get(reverse("admin:chat_llmcall_usage"), {"days": 120}).content.decode()
    assert "3 calls" in month


def test_usage_page_needs_a_staff_login(client):
    response = client.get(reverse("admin:chat_llmcall_usage"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_offline_banner_shows_only_without_a_model(admin_client):
    assert config.get_config().offline
    assert "Offline mode: no model configured" in admin_client.get(reverse("admin:index")).content.decode()
    with config.override(llm={"model": "some-model"}):
        assert "Offline mode" not in admin_client.get(reverse("admin:index")).content.decode()
