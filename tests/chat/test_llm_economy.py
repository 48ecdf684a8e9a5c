"""Models per task, fallbacks and daily budgets, through the real openai client against the local
scripted server: what is routed where, what a failing primary costs, and that a cap stops calls until
the next local midnight (injected clock)."""

import logging
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from chat.agent import budget, llm
from chat.models import LLMCall, LLMSpend
from core import config
from tests.chat.planner_helpers import inbound_store
from tests.fake_llm import FakeLLM

pytestmark = pytest.mark.django_db(transaction=True)

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
def provider():
    with FakeLLM() as server:
        yield server


def models_config(server: FakeLLM, **llm_extra):
    """Two named models on the scripted server (told apart by their model ids), cheap and big."""
    return config.override(
        llm={
            "max_retries": 0,
            "models": [
                {
                    "name": "big",
                    "base_url": server.base_url,
                    "model": "big-1",
                    "price_input_per_1m": 10.0,
                    "price_output_per_1m": 30.0,
                },
                {"name": "small", "base_url": server.base_url, "model": "small-1", "price_input_per_1m": 1.0},
            ],
            **llm_extra,
        }
    )


@pytest.fixture
def clock(monkeypatch):
    """budget.clock, injected: standing still at noon in the bot's time zone until advanced."""
    tz = config.get_config().tzinfo
    now = {"at": datetime.now(tz).replace(hour=12, minute=0, second=0, microsecond=0)}
    monkeypatch.setattr(budget, "clock", lambda: now["at"])
    return now


def test_each_task_goes_to_its_model_and_unrouted_tasks_to_the_first(provider):
    with models_config(provider, tasks={"planner": ["big"], "summary": ["small"]}):
        for purpose in ("planner", "summary", "life", "memory_search"):
            assert llm.complete_sync(purpose=purpose, messages=ASK).ok
    assert [r["model"] for r in provider.requests] == ["big-1", "small-1", "big-1", "big-1"]
    rows = list(LLMCall.objects.order_by("id").values_list("purpose", "task", "model_name", "model", "attempt"))
    assert rows == [
        ("planner", "planner", "big", "big-1", 0),
        ("summary", "summary", "small", "small-1", 0),
        ("life", "life", "big", "big-1", 0),
        ("memory_search", "utility", "big", "big-1", 0),
    ]
    # Each row is priced at its own model's prices.
    big, small = LLMCall.objects.order_by("id")[:2]
    assert float(big.cost) == pytest.approx(100 * 10 / 1e6 + 20 * 30 / 1e6)
    assert float(small.cost) == pytest.approx(100 * 1 / 1e6)


def test_the_single_model_config_is_the_default_model_and_may_be_a_fallback(provider):
    with config.override(llm={"base_url": provider.base_url, "model": "solo", "max_retries": 0}):
        assert config.get_config().llm_route("planner")[0].name == "default"
        llm.complete_sync(purpose="planner", messages=ASK)
    with models_config(provider, base_url=provider.base_url, model="solo", tasks={"planner": ["big", "default"]}):
        provider.script(provider.error(503))
        result = llm.complete_sync(purpose="planner", messages=ASK)
        # Unrouted tasks keep going to the single model of [llm].
        llm.complete_sync(purpose="life", messages=ASK)
    assert result.ok and result.model_name == "default" and result.attempts == 2
    assert [r["model"] for r in provider.requests] == ["solo", "big-1", "solo", "solo"]


async def test_a_500_on_the_primary_falls_back_and_both_attempts_are_ledgered(provider):
    provider.script(provider.error(500), provider.text("from the fallback"))
    with models_config(provider, tasks={"planner": ["big", "small"]}):
        result = await llm.complete(purpose="planner", messages=ASK)
    assert result.ok and result.content == "from the fallback" and result.model_name == "small"
    rows = [(c.model_name, c.attempt, c.error[:8]) async for c in LLMCall.objects.order_by("id")]
    assert rows == [("big", 0, "HTTP 500"), ("small", 1, "")]


def test_a_timeout_on_the_primary_falls_back_within_the_hard_timeout(provider):
    provider.script(provider.delay(3, provider.text("too late")), provider.text("quick"))
    with models_config(provider, tasks={"life": ["big", "small"]}):
        cfg = config.get_config().model_dump()["llm"]
        cfg["models"][0]["timeout"] = 0.3
        with config.override(llm=cfg):
            result = llm.complete_sync(purpose="life", messages=ASK, timeout=5, hard_timeout=True)
            slow_first = llm.complete_sync(purpose="summary", messages=ASK)  # unrouted: big, own timeout
    assert result.ok and result.content == "quick" and result.attempts == 2
    # The primary's own timeout bounded its attempt (not the whole 5 s), and the fallback answered.
    errors = list(LLMCall.objects.order_by("id").values_list("model_name", "error"))
    assert errors[:2] == [("big", "timeout after 0.3s"), ("small", "")]
    assert slow_first.ok and errors[2] == ("big", "")


def test_when_every_model_fails_the_last_error_is_the_result(provider):
    provider.script(provider.error(500), provider.error(502))
    with models_config(provider, tasks={"planner": ["big", "small"]}):
        result = llm.complete_sync(purpose="planner", messages=ASK)
    assert not result.ok and "HTTP 502" in result.error and not result.budget_exceeded
    assert LLMCall.objects.count() == 2


def test_a_task_cap_stops_calls_until_local_midnight_and_alerts_once(provider, clock, caplog):
    budgets = [{"scope": "task", "target": "planner", "daily_tokens": 250}]
    caplog.set_level(logging.WARNING, logger="chat.agent.budget")
    with models_config(provider, budgets=budgets):
        made = [llm.complete_sync(purpose="planner", messages=ASK) for _ in range(3)]  # 120 tokens each
        refused = llm.complete_sync(purpose="planner", messages=ASK)
        refused_again = llm.complete_sync(purpose="planner", messages=ASK)
        other_task = llm.complete_sync(purpose="life", messages=ASK)
        assert all(r.ok for r in made) and other_task.ok
        assert len(provider.requests) == 4  # no request for the refused calls
        tz = config.get_config().tzinfo
        midnight = (clock["at"] + timedelta(days=1)).replace(hour=0)
        assert refused.budget_exceeded == refused_again.budget_exceeded
        assert refused.budget_exceeded == (
            f"daily budget reached: task planner (250 tokens); resets at {config.format_instant(midnight, tz)}"
        )
        alerts = [r.getMessage() for r in caplog.records if "budget reached" in r.getMessage()]
        assert alerts == [
            f"LLM daily budget reached: task planner (250 tokens); calls under it wait until "
            f"{config.format_instant(midnight, tz)}"
        ]
        [state] = budget.budget_states()
        assert (state.tokens, state.reached) == (360, True)
        assert LLMSpend.objects.get(scope="task", target="planner").refused == 2
        # One second before local midnight it still holds; at midnight the new day is open.
        clock["at"] = midnight - timedelta(seconds=1)
        assert llm.complete_sync(purpose="planner", messages=ASK).budget_exceeded
        clock["at"] = midnight
        assert llm.complete_sync(purpose="planner", messages=ASK).ok
    assert len(provider.requests) == 5


def test_a_capped_model_is_skipped_for_the_next_and_a_session_cap_holds_per_chat(provider, clock, make_session):
    alice, bob = make_session(), make_session()
    budgets = [
        {"scope": "model", "target": "big", "daily_cost": 0.0015},  # one big call costs 0.0016
        {"scope": "session", "daily_tokens": 240},
    ]
    with models_config(provider, tasks={"planner": ["big", "small"]}, budgets=budgets):
        first = llm.complete_sync(purpose="planner", messages=ASK, session_id=alice.pk)
        second = llm.complete_sync(purpose="planner", messages=ASK, session_id=alice.pk)
        third = llm.complete_sync(purpose="planner", messages=ASK, session_id=alice.pk)
        bobs = llm.complete_sync(purpose="planner", messages=ASK, session_id=bob.pk)
    assert (first.model_name, second.model_name, bobs.model_name) == ("big", "small", "small")
    assert third.budget_exceeded.startswith(f"daily budget reached: chat {alice.pk} (240 tokens)")
    assert [r["model"] for r in provider.requests] == ["big-1", "small-1", "small-1"]


def test_a_cap_added_mid_day_counts_the_day_so_far_from_the_ledger(provider, clock):
    with models_config(provider):
        for _ in range(2):
            llm.complete_sync(purpose="summary", messages=ASK)
        with config.override(llm={"budgets": [{"scope": "task", "target": "summary", "daily_tokens": 200}]}):
            result = llm.complete_sync(purpose="summary", messages=ASK)
    assert result.budget_exceeded and len(provider.requests) == 2


def test_a_budget_must_cap_something_and_name_what_exists():
    for bad, message in [
        ({"scope": "task", "target": "planner"}, "needs daily_tokens or daily_cost"),
        ({"scope": "task", "target": "chat", "daily_tokens": 5}, "task budget's target"),
        ({"scope": "model", "target": "nope", "daily_tokens": 5}, "unknown model 'nope'"),
        ({"scope": "session", "target": "x", "daily_tokens": 5}, "leave target empty"),
        ({"scope": "task", "target": "planner", "daily_tokens": -1}, "greater than or equal to 0"),
        ({"scope": "task", "target": "planner", "daily_cost": float("inf")}, "finite number"),
    ]:
        with pytest.raises(config.ConfigError, match=message):
            config.parse_config(_toml_budget(bad))
    with pytest.raises(config.ConfigError, match="unknown model"):
        config.parse_config('[llm]\ntasks = {planner = ["ghost"]}\n')


def _toml_budget(budget: dict) -> str:
    lines = ["[[llm.budgets]]"]
    for key, value in budget.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
    return "\n".join(lines) + "\n"


def test_a_summary_waits_while_its_task_is_over_budget(provider, clock, make_session):
    from scheduling.life import memory
    from scheduling.life.models import SessionSummary

    session = make_session()
    for i in range(3):
        inbound_store(session=session, text=f"message {i}")
    budgets = [{"scope": "task", "target": "summary", "daily_tokens": 1}]
    with models_config(provider, budgets=budgets):
        LLMSpend.objects.create(day=budget.local_day(clock["at"], config.get_config().tzinfo), scope="task",
                                target="summary", tokens=5)  # fmt: skip
        requested = timezone.now()
        SessionSummary.objects.update_or_create(session=session, defaults={"refresh_requested_at": requested})
        assert memory.summary_refresh(session.pk).startswith("waiting: daily budget reached: task summary")
    summary = SessionSummary.objects.get(session=session)
    assert summary.refresh_requested_at == requested and summary.text == "" and not summary.error
    assert provider.requests == []
