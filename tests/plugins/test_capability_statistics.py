"""statistics.local.* through the real maibot-plugin-sdk's PluginContext: MaiBot 1.3's shapes (model rows,
time series with labelled keys, pies) from our LLM ledger, messages, tool calls and process heartbeats,
bucketed in the configured time zone; bad arguments are MaiBot's error results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from chat.models import LLMCall, Message, PlannerCycle, ToolCallRecord
from core import config
from core.models import ProcessHeartbeat
from tests.chat.planner_helpers import inbound_store
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)

STATS = [
    "statistics.local.models", "statistics.local.model_trend", "statistics.local.token_trend",
    "statistics.local.token_distribution", "statistics.local.message_trend", "statistics.local.tool_trend",
    "statistics.local.online_time_trend",
]  # fmt: skip
# 01:30 UTC on the 24th is 09:30 on the 24th in Shanghai; 18:30 UTC on the 24th is 02:30 on the 25th.
EARLY, LATE = datetime(2026, 11, 24, 1, 30, tzinfo=UTC), datetime(2026, 11, 24, 18, 30, tzinfo=UTC)


def call(model_name: str, when: datetime, tokens: tuple[int, int], *, purpose: str = "planner", ms: int = 1000):
    row = LLMCall.objects.create(
        purpose=purpose, task="planner", model=f"provider/{model_name or 'raw'}", model_name=model_name,
        prompt_tokens=tokens[0], completion_tokens=tokens[1], latency_ms=ms, cost=Decimal("0.010000"),
    )  # fmt: skip
    LLMCall.objects.filter(pk=row.pk).update(created_at=when)


@pytest.fixture
def ledger(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: datetime(2026, 11, 25, 12, 0, tzinfo=UTC))
    call("deepseek", EARLY, (100, 20))
    call("deepseek", LATE, (50, 10), purpose="plugin:test.x", ms=3000)
    call("qwen", LATE, (10, 5))
    call("", LATE, (1, 1))  # no configured name: the provider's model id
    call("old", datetime(2026, 1, 1, tzinfo=UTC), (999, 999))  # outside 7 days
    with config.override(bot={"time_zone": "Asia/Shanghai"}):
        yield plugin("test.core.stats", STATS)[1]


def test_models_and_token_series_come_from_the_ledger(ledger):
    ctx = ledger
    row = ("model_name", "request_count", "total_cost", "total_tokens", "avg_response_time")
    assert run(ctx.statistics.local.models(days=7, limit=2)) == [
        dict(zip(row, ("deepseek", 2, 0.02, 180, 2.0), strict=True)),
        dict(zip(row, ("provider/raw", 1, 0.01, 2, 1.0), strict=True)),
    ]
    tokens = run(ctx.statistics.local.token_trend(days=7))
    assert tokens["timestamps"] == ["2026-11-24 00:00:00", "2026-11-25 00:00:00"]  # Shanghai days
    assert tokens["values_by_key"]["total_tokens"] == [120.0, 77.0]
    assert tokens["values_by_key"]["request_count"] == [1.0, 3.0]
    assert tokens["labels_by_key"]["prompt_tokens"] == "输入 token" and tokens["total"] == 197.0
    by_module = run(ctx.statistics.local.token_trend(days=7, bucket="hour", group_by="module", top_items=1))
    assert by_module["labels_by_key"] == {"planner": "planner"}
    assert by_module["timestamps"] == ["2026-11-24 09:00:00", "2026-11-25 02:00:00"]
    trend = run(ctx.statistics.local.model_trend(days=7, metric="request", top_models=10))
    assert trend["labels_by_key"]["deepseek"] == "deepseek" and trend["values_by_key"]["deepseek"] == [1.0, 1.0]
    assert trend["labels_by_key"]["provider_raw"] == "provider/raw"  # keys are sanitized, labels as they are
    latency = run(ctx.statistics.local.model_trend(days=7, metric="耗时", module_name="plugin:test.x"))
    assert latency["values_by_key"] == {"deepseek": [3.0]}
    pies = run(ctx.statistics.local.token_distribution(days=7, group_by="model", top_items=1))
    assert pies["pies"][0] == {
        "title": "Token 按模型分布",
        "data": [{"name": "deepseek", "value": 180}, {"name": "其他", "value": 17}],
    }
    assert pies["total"] == 197 and pies["source_count"] == 3


def test_messages_tools_and_online_time_are_series_too(ledger, make_session):
    ctx = ledger
    group = make_session(chat_type="group", group_name="摸鱼群")
    for when in (EARLY, LATE, LATE):
        Message.objects.filter(pk=inbound_store(session=group, text="x").pk).update(time=when)
    cycle = PlannerCycle.objects.create(started_at=LATE)
    for name in ("reply", "reply", "get_weather"):
        ToolCallRecord.objects.filter(pk=ToolCallRecord.objects.create(cycle=cycle, name=name).pk).update(
            created_at=LATE
        )
    ProcessHeartbeat.objects.create(
        instance="a", name="h:1", role="web", started_at=LATE - timedelta(minutes=90), beat_at=LATE, alive_until=LATE
    )
    ProcessHeartbeat.objects.create(  # overlapping: counted once
        instance="b", name="h:2", role="web", started_at=LATE - timedelta(minutes=30), beat_at=LATE, alive_until=LATE
    )

    messages = run(ctx.statistics.local.message_trend(days=7))
    assert messages["labels_by_key"] == {"摸鱼群": "摸鱼群"} and messages["values_by_key"]["摸鱼群"] == [1.0, 2.0]
    tools = run(ctx.statistics.local.tool_trend(days=7, top_tools=1))
    assert tools["values_by_key"] == {"reply": [2.0]} and tools["timestamps"] == ["2026-11-25 00:00:00"]
    online = run(ctx.statistics.local.online_time_trend(days=7, bucket="hour"))
    assert online["timestamps"] == ["2026-11-25 01:00:00", "2026-11-25 02:00:00"]
    assert online["values_by_key"]["online_hours"] == [1.0, 0.5] and online["total"] == 1.5


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"days": 0}, "days 必须为正整数"),
        ({"bucket": "week"}, "bucket 只支持 hour 或 day"),
        ({"top_tools": "x"}, "top_tools 必须为正整数"),
    ],
)
def test_bad_arguments_are_maibots_error_results(ledger, args, error):
    result = run(ledger.call_capability("statistics.local.tool_trend", **args))
    assert result == {"success": False, "error": error}
