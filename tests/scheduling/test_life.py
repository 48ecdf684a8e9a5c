"""The life-loop turn through the real openai client against the scripted local server."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import LLMCall, Message, PlannerCycle, SourceKind, ToolCallRecord
from core import config
from scheduling.life.loop import run_firing
from scheduling.life.memory import inner_state_get, inner_state_update, memory_slot_set
from scheduling.life.models import FiringStatus, InnerStateRevision, Timer, TimerFiring
from scheduling.life.timers import fire_due, timer_create
from scheduling.services import SYSTEM
from tests.conftest import wait_for
from tests.fake_llm import FakeLLM

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake_llm():
    with (
        FakeLLM() as server,
        config.override(llm={"base_url": server.base_url, "model": "fake-model", "max_retries": 0}),
    ):
        yield server


def fire(timer) -> TimerFiring:
    """Make the timer due and let the dispatcher claim it, as the cluster would."""
    Timer.objects.filter(pk=timer.pk).update(next_fire=timezone.now() - timedelta(seconds=0.1))
    _, firing_ids = fire_due(timezone.now(), limit=10)
    assert len(firing_ids) == 1
    return TimerFiring.objects.get(pk=firing_ids[0])


@pytest.fixture
def timer(make_session):
    session = make_session(user_nickname="小明")
    return timer_create(
        spec="cron:0 8 * * *", label="早安 good morning", payload="问候小明", session=session, acted_by=SYSTEM
    )


def test_a_turn_can_send_a_message_to_the_timers_chat(fake_llm, timer):
    inner_state_update(text="今天心情不错", via="system")
    memory_slot_set(key="小明的生日", content="5月3日", session=timer.session)
    fake_llm.script(fake_llm.tool_call("send_message", {"text": "早上好，小明！"}))
    firing = fire(timer)
    assert run_firing(firing.pk) == "sent"

    (msg,) = Message.objects.filter(session=timer.session)
    assert (msg.text, msg.source_kind, msg.delivery_status) == ("早上好，小明！", SourceKind.TIMER, "pending")
    assert msg.extra["timer_id"] == timer.pk
    body = fake_llm.requests[0]
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert user == "[timer] 早安 good morning: 问候小明"
    assert config.get_config().bot.persona in system
    assert "今天心情不错" in system and "小明的生日: 5月3日" in system and "Current time:" in system
    assert {t["function"]["name"] for t in body["tools"]} == {"send_message", "update_inner_state", "do_nothing"}

    firing.refresh_from_db()
    assert firing.status == FiringStatus.DONE and firing.outcome == "sent"
    cycle = firing.cycle
    assert cycle.kind == "life" and cycle.action == "sent" and cycle.session == timer.session and cycle.ended_at
    (call,) = cycle.tool_calls.all()
    assert call.name == "send_message" and call.ok and call.result["session_id"] == timer.session.session_id
    (ledger,) = LLMCall.objects.filter(cycle=cycle)
    assert ledger.purpose == "life" and ledger.prompt_tokens == 100


def test_a_turn_can_update_the_inner_state_with_history(fake_llm, timer):
    inner_state_update(text="old", via="system")
    fake_llm.script(fake_llm.tool_call("update_inner_state", {"text": "有点困，想早点睡"}))
    firing = fire(timer)
    assert run_firing(firing.pk) == "updated"
    assert inner_state_get().text == "有点困，想早点睡"
    rev = InnerStateRevision.objects.first()
    assert (rev.via, rev.previous_text, rev.text) == ("life", "old", "有点困，想早点睡")
    firing.refresh_from_db()
    assert rev.cycle == firing.cycle and rev.tool_call_id
    assert not Message.objects.exists()


def test_a_turn_can_decide_to_do_nothing(fake_llm, timer):
    fake_llm.script(fake_llm.tool_call("do_nothing", {"reason": "太早了 too early"}))
    firing = fire(timer)
    assert run_firing(firing.pk) == "nothing"
    assert not Message.objects.exists()
    record = ToolCallRecord.objects.get()
    assert record.ok and record.result["reason"] == "太早了 too early"


def test_a_turn_can_send_to_another_chat_by_session_id(fake_llm, timer, make_session):
    other = make_session()
    fake_llm.script(
        fake_llm.tool_calls(
            ("send_message", {"text": "hi", "session": other.session_id}),
            ("send_message", {"text": "x", "session": "nope"}),
        )
    )
    firing = fire(timer)
    run_firing(firing.pk)
    assert list(Message.objects.values_list("session_id", "text")) == [(other.pk, "hi")]
    bad = ToolCallRecord.objects.get(ok=False)
    assert bad.result["error"]["code"] == "unknown_session"


def test_malformed_arguments_and_unknown_tools_are_recorded_and_send_nothing(fake_llm, timer):
    fake_llm.script(fake_llm.tool_calls(("send_message", '{"text": "oops'), ("launch_rockets", {"n": 1})))
    firing = fire(timer)
    assert run_firing(firing.pk) == "error"
    assert not Message.objects.exists()
    malformed, unknown = ToolCallRecord.objects.order_by("id")
    assert not malformed.ok and malformed.result["error"]["code"] == "invalid_arguments"
    assert malformed.raw_arguments == '{"text": "oops'
    assert not unknown.ok and unknown.result["error"]["code"] == "unknown_tool"
    firing.refresh_from_db()
    assert firing.status == FiringStatus.FAILED and "send_message" in firing.error
    assert PlannerCycle.objects.get().action == "error"


def test_a_turn_that_runs_past_its_timeout_is_cut_off_and_recorded(fake_llm, timer):
    fake_llm.script(fake_llm.delay(3, fake_llm.tool_call("send_message", {"text": "too late"})))
    firing = fire(timer)
    with config.override(life={"turn_timeout": 0.5}):
        assert run_firing(firing.pk) == "timeout"
    assert not Message.objects.exists()
    firing.refresh_from_db()
    assert firing.status == FiringStatus.FAILED and "0.5s" in firing.error
    cycle = firing.cycle
    assert cycle.action == "timeout" and cycle.ended_at
    assert LLMCall.objects.filter(cycle=cycle, purpose="life").exclude(error="").exists()
    timer.refresh_from_db()
    assert "0.5s" in timer.last_error


def test_a_provider_error_fails_the_turn_with_the_reason(fake_llm, timer):
    fake_llm.script(fake_llm.error(500, "upstream down"))
    firing = fire(timer)
    assert run_firing(firing.pk) == "error"
    firing.refresh_from_db()
    assert firing.status == FiringStatus.FAILED and "HTTP 500" in firing.error
    assert LLMCall.objects.get(cycle=firing.cycle).error


def test_text_without_a_tool_call_sends_nothing(fake_llm, timer):
    fake_llm.script(fake_llm.text("早上好"))
    firing = fire(timer)
    assert run_firing(firing.pk) == "text_only"
    assert not Message.objects.exists()
    assert PlannerCycle.objects.get().reasoning == "早上好"


def test_a_firing_runs_its_turn_only_once(fake_llm, timer):
    fake_llm.script(fake_llm.tool_call("send_message", {"text": "once"}))
    firing = fire(timer)
    assert run_firing(firing.pk) == "sent"
    assert run_firing(firing.pk) == "already taken"  # the broker delivered the task twice
    assert Message.objects.count() == 1 and len(fake_llm.requests) == 1


def test_offline_a_say_payload_is_sent_as_written_without_a_model(make_session):
    session = make_session()
    timer = timer_create(
        spec="5min", label="吃药", payload="say: 记得吃药 take your pills", session=session, acted_by=SYSTEM
    )
    assert config.get_config().offline
    firing = fire(timer)
    assert run_firing(firing.pk) == "literal"
    assert Message.objects.get().text == "记得吃药 take your pills"
    assert not LLMCall.objects.exists()


def test_offline_other_payloads_are_skipped(make_session):
    timer = timer_create(spec="5min", label="think", payload="reflect", session=make_session(), acted_by=SYSTEM)
    firing = fire(timer)
    assert run_firing(firing.pk) == "skipped"
    firing.refresh_from_db()
    assert firing.status == FiringStatus.SKIPPED and not Message.objects.exists()
    assert PlannerCycle.objects.get(kind="life").action == "skipped"


def test_a_cancelled_timers_pending_turn_is_skipped(fake_llm, timer):
    from scheduling.life.timers import timer_cancel

    firing = fire(timer)
    timer_cancel(timer_id=timer.pk, acted_by=SYSTEM)
    assert run_firing(firing.pk) == "skipped"
    assert not fake_llm.requests


def test_a_say_payload_is_sent_as_written_without_asking_the_model(fake_llm, make_session):
    session = make_session()
    timer = timer_create(
        spec="5min", label="reminder", payload="say:开会了 meeting time", session=session, acted_by=SYSTEM
    )
    firing = fire(timer)
    assert run_firing(firing.pk) == "literal"
    assert Message.objects.get(session=session).text == "开会了 meeting time"
    assert not fake_llm.requests and not LLMCall.objects.exists()


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_a_cluster_worker_runs_the_turn_against_the_model(make_session, start_qcluster):
    with FakeLLM() as fake:
        fake.script(fake.tool_call("send_message", {"text": "起床啦 time to get up"}))
        start_qcluster(OPENAI_BASE_URL=fake.base_url, MAIBOT_LLM_MODEL="fake-model")
        session = make_session()
        timer = timer_create(spec="2s", label="wake up", payload="gently", session=session, acted_by=SYSTEM)
        wait_for(lambda: Message.objects.filter(session=session).exists(), timeout=30)
        assert [m.text for m in Message.objects.filter(session=session)] == ["起床啦 time to get up"]
        assert fake.requests[0]["messages"][1]["content"] == "[timer] wake up: gently"
    firing = TimerFiring.objects.get(timer=timer)
    wait_for(lambda: TimerFiring.objects.filter(pk=firing.pk).exclude(status=FiringStatus.RUNNING).exists(), timeout=10)
    firing.refresh_from_db()
    assert firing.status == FiringStatus.DONE and firing.outcome == "sent"
    assert LLMCall.objects.get(cycle=firing.cycle).purpose == "life"
