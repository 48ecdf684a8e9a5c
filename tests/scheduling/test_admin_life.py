"""Operators manage timers, the inner state and memory in the admin; life-loop turns are read-only."""

from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from chat.models import CycleKind, LLMCall, PlannerCycle, ToolCallRecord
from core import config
from scheduling.life.memory import inner_state_update, memory_slot_set
from scheduling.life.models import InnerState, InnerStateRevision, MemorySlot, Timer, TimerStatus
from scheduling.life.timers import fire_due, timer_create
from scheduling.services import SYSTEM

pytestmark = pytest.mark.django_db

TIMERS = reverse("admin:scheduling_timer_changelist")


@pytest.fixture
def operator(admin_user, client):
    client.force_login(admin_user)
    return admin_user


def test_timer_list_filters_and_actions(client, operator, make_session):
    active = timer_create(spec="cron:0 8 * * *", label="早安 morning", session=make_session(), acted_by=SYSTEM)
    other = timer_create(spec="5min", label="second", session=make_session(), acted_by=SYSTEM)
    html = client.get(TIMERS).content.decode()
    assert "早安 morning" in html and "cron:0 8 * * *" in html and "+0800" in html
    assert client.get(TIMERS, {"status": "active", "kind": "cron"}).status_code == 200

    page = client.post(TIMERS, {"action": "fire_now_selected", ACTION_CHECKBOX_NAME: [active.pk]}, follow=True)
    assert "Fired 1 timer" in page.content.decode()
    assert len(fire_due(timezone.now(), limit=10)[1]) == 1

    page = client.post(TIMERS, {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [other.pk]}, follow=True)
    assert "Cancelled 1 timer" in page.content.decode()
    assert Timer.objects.get(pk=other.pk).status == TimerStatus.CANCELLED
    page = client.post(TIMERS, {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [other.pk]}, follow=True)
    assert "Skipped" in page.content.decode() and "not active" in page.content.decode()


def test_timer_change_page_previews_cron_fires_and_validates_a_new_spec(client, operator, make_session):
    timer = timer_create(spec="cron:0 8 * * *", label="morning", session=make_session(), acted_by=SYSTEM)
    url = reverse("admin:scheduling_timer_change", args=[quote(timer.pk)])
    html = client.get(url).content.decode()
    assert html.count(" 08:00:00 +0800") >= 5  # the next five fires, in the bot's time zone

    bad = client.post(url, {"spec": "cron:0 25 * * *", "label": "morning", "payload": ""})
    assert bad.status_code == 200 and "not a valid cron expression" in bad.content.decode()
    assert Timer.objects.get(pk=timer.pk).spec == "cron:0 8 * * *"

    good = client.post(url, {"spec": "cron:30 21 * * *", "label": "evening", "payload": "say:晚安"}, follow=True)
    assert good.status_code == 200
    timer.refresh_from_db()
    assert (timer.spec, timer.label, timer.payload) == ("cron:30 21 * * *", "evening", "say:晚安")
    local = timer.next_fire.astimezone(config.get_config().tzinfo)
    assert (local.hour, local.minute) == (21, 30)


def test_an_operator_can_add_a_timer_with_a_validated_spec(client, operator, make_session):
    session = make_session()
    add = reverse("admin:scheduling_timer_add")
    bad = client.post(add, {"session": session.pk, "spec": "once:2020-01-01 08:00", "label": "x", "payload": ""})
    assert "in the past" in bad.content.decode()
    assert not Timer.objects.exists()
    client.post(add, {"session": session.pk, "spec": "2h", "label": "check in", "payload": ""}, follow=True)
    timer = Timer.objects.get()
    assert timer.created_via == "operator" and timer.created_by_user == operator and timer.session == session


def test_inner_state_edit_keeps_history_with_the_operator(client, operator):
    inner_state_update(text="first", via="life")
    page = client.get(reverse("admin:scheduling_innerstate_changelist"), follow=True)
    assert "first" in page.content.decode()
    url = reverse("admin:scheduling_innerstate_change", args=[1])
    client.post(url, {"text": "operator says hi"}, follow=True)
    assert InnerState.objects.get().text == "operator says hi"
    rev = InnerStateRevision.objects.first()
    assert (rev.via, rev.user, rev.previous_text) == ("operator", operator, "first")
    html = client.get(url).content.decode()
    assert f"operator ({operator.username})" in html and "life" in html


def test_memory_slots_are_managed_through_the_service_limits(client, operator, make_session):
    session = make_session()
    add = reverse("admin:scheduling_memoryslot_add")
    with config.override(life={"memory_max_slots": 1}):
        memory_slot_set(key="a", content="x", session=None)
        page = client.post(add, {"key": "b", "content": "y"}, follow=True)
        assert "forget one first" in page.content.decode()
        client.post(add, {"key": "b", "content": "per chat", "session": session.pk}, follow=True)
    assert MemorySlot.objects.filter(session=session, key="b", updated_via="operator").exists()
    html = client.get(reverse("admin:scheduling_memoryslot_changelist"), {"scope": "global"}).content.decode()
    assert "global" in html


def test_life_turns_are_listed_with_their_tool_calls_and_llm_calls(client, operator, make_session):
    cycle = PlannerCycle.objects.create(
        kind=CycleKind.LIFE, started_at=timezone.now() - timedelta(seconds=3), trigger="timer tm_x: 早安", action="sent"
    )
    PlannerCycle.objects.create(kind=CycleKind.CHAT, started_at=timezone.now(), trigger="chat only")
    ToolCallRecord.objects.create(cycle=cycle, name="send_message", arguments={"text": "早上好"}, result={"ok": True})
    LLMCall.objects.create(cycle=cycle, purpose="life", model="fake-model", prompt_tokens=123)
    listing = client.get(reverse("admin:scheduling_lifeturn_changelist")).content.decode()
    assert "timer tm_x: 早安" in listing and "chat only" not in listing
    detail = client.get(reverse("admin:scheduling_lifeturn_change", args=[cycle.pk])).content.decode()
    assert "send_message" in detail and "早上好" in detail and "123" in detail
