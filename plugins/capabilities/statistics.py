"""statistics.local.*: this bot's usage figures, in the shapes MaiBot 1.3's host answers
(src/plugin_runtime/capabilities/data.py), from our own records: model calls from the LLM ledger
(chat.LLMCall), messages per chat (chat.Message), tool calls (chat.ToolCallRecord), online time from the
server processes' heartbeats (core.ProcessHeartbeat: each web process from its start to its last beat).

A series is {timestamps, values_by_key, labels_by_key, total, source_count}; timestamps are bucket starts
"YYYY-MM-DD HH:00:00" (hour) or "YYYY-MM-DD 00:00:00" (day) in the configured time zone (as MaiBot's,
which are its local time). MaiBot's groupings map to our columns: model → the configured model's name
(else the provider's model id), module → the call's purpose (planner, summary, plugin:<id>, …), type →
its task, provider → the provider's model id (we record no provider name). `days` is 1–365 (default 7),
the top-N arguments 1–50; anything else is an error result.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Avg, Count, F, Sum, Value
from django.db.models.functions import Coalesce, NullIf, TruncDay, TruncHour
from django.utils import timezone

from plugins.capabilities.common import db

if TYPE_CHECKING:
    from plugins.records import PluginRecord

GROUPS = {"model": "model_label", "module": "module_label", "provider": "provider_label", "type": "type_label"}
GROUP_NAMES = {"model": "模型", "module": "模块", "provider": "服务商", "type": "请求类型"}
TOKEN_LABELS = {"total_tokens": "总 token", "prompt_tokens": "输入 token", "completion_tokens": "输出 token"}


class StatisticsArgError(ValueError):
    """An argument MaiBot's host refuses too (days, bucket, a top-N, group_by)."""


def _days(args: dict[str, Any]) -> int:
    try:
        days = int(args.get("days", 7))
    except (TypeError, ValueError):
        raise StatisticsArgError("days 必须为正整数") from None
    if days <= 0:
        raise StatisticsArgError("days 必须为正整数")
    return min(days, 365)


def _top(args: dict[str, Any], key: str, default: int = 10) -> int:
    try:
        value = int(args.get(key, default))
    except (TypeError, ValueError):
        raise StatisticsArgError(f"{key} 必须为正整数") from None
    if value <= 0:
        raise StatisticsArgError(f"{key} 必须为正整数")
    return min(value, 50)


def _bucket(args: dict[str, Any]) -> str:
    bucket = str(args.get("bucket") or "day").strip().lower()
    if bucket in {"h", "hour", "hours", "1h", "小时", "按小时"}:
        return "hour"
    if bucket in {"d", "day", "days", "1d", "天", "按天"}:
        return "day"
    raise StatisticsArgError("bucket 只支持 hour 或 day")


def _group(args: dict[str, Any], default: str = "model") -> str:
    group_by = str(args.get("group_by") or default).strip().lower()
    if group_by not in GROUPS:
        raise StatisticsArgError("group_by 只支持 model、module、provider 或 type")
    return group_by


def _zone():
    from core.config import get_config

    return get_config().tzinfo


def _since(days: int) -> datetime:
    return timezone.now() - timedelta(days=days)


def _trunc(column: str, bucket: str):
    return (TruncHour if bucket == "hour" else TruncDay)(column, tzinfo=_zone())


def _label(moment: datetime, bucket: str) -> str:
    local = moment.astimezone(_zone())
    return local.strftime("%Y-%m-%d %H:00:00" if bucket == "hour" else "%Y-%m-%d 00:00:00")


def _key(label: str, used: set[str]) -> str:
    key = re.sub(r"[^0-9a-zA-Z_\u4e00-\u9fff]+", "_", label.strip()).strip("_") or "unknown"
    candidate, n = key, 2
    while candidate in used:
        candidate, n = f"{key}_{n}", n + 1
    used.add(candidate)
    return candidate


def _series(rows: list[tuple[str, str, float]], labels: list[str]) -> dict[str, Any]:
    """MaiBot's time series from (bucket label, series label, value) rows, series in `labels`' order."""
    buckets: dict[str, dict[str, float]] = {}
    for bucket, label, value in rows:
        buckets.setdefault(bucket, {})[label] = float(value or 0)
    timestamps = sorted(buckets)
    used: set[str] = set()
    keys = {label: _key(label, used) for label in labels}
    values = {keys[label]: [buckets[t].get(label, 0.0) for t in timestamps] for label in labels}
    return {
        "timestamps": timestamps,
        "values_by_key": values,
        "labels_by_key": {keys[label]: label for label in labels},
        "total": sum(sum(v) for v in values.values()),
        "source_count": len(rows),
    }


def _calls(days: int):
    from chat.models import LLMCall

    def label(*columns: str):
        return Coalesce(*(NullIf(c, Value("")) for c in columns), Value("Unknown"))

    return LLMCall.objects.filter(created_at__gte=_since(days)).annotate(
        model_label=label("model_name", "model"),
        module_label=label("purpose"),
        provider_label=label("model"),
        type_label=label("task"),
        tokens=F("prompt_tokens") + F("completion_tokens"),
    )


METRICS = {
    "token": Sum("tokens"),
    "request": Count("pk"),
    "cost": Sum("cost"),
    "latency": Avg("latency_ms") / 1000.0,
}


METRIC_ALIASES = {
    "request": {"request", "requests", "count", "次数"},
    "cost": {"cost", "费用", "花费"},
    "latency": {"latency", "time", "耗时", "延迟"},
}


def _metric(name: Any) -> str:
    name = str(name or "").strip().lower()
    return next((metric for metric, aliases in METRIC_ALIASES.items() if name in aliases), "token")


def _trend(rows, at: str, column: str, value, ranking, bucket: str, top: int) -> dict[str, Any]:
    """The top `top` values of `column` by `ranking`, and their series of `value` per bucket of `at`."""
    ranked = rows.values(column).annotate(rank=ranking).order_by("-rank", column)[:top]
    labels = [str(r[column]) for r in ranked]
    points = rows.filter(**{f"{column}__in": labels}).annotate(at=_trunc(at, bucket)).values("at", column)
    return _series([(_label(p["at"], bucket), str(p[column]), p["v"]) for p in points.annotate(v=value)], labels)


async def _answer(key: str, work) -> dict[str, Any]:
    try:
        return {"success": True, key: await db(work)}
    except StatisticsArgError as exc:
        return {"success": False, "error": str(exc)}


async def models(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def read() -> list[dict[str, Any]]:
        rows = _calls(_days(args)).values("model_label")
        rows = rows.annotate(n=Count("pk"), cost=Sum("cost"), tokens_sum=Sum("tokens"), latency=Avg("latency_ms"))
        return [
            {
                "model_name": r["model_label"],
                "request_count": r["n"],
                "total_cost": float(r["cost"] or 0),
                "total_tokens": int(r["tokens_sum"] or 0),
                "avg_response_time": float(r["latency"] or 0) / 1000,
            }
            for r in rows.order_by("-n", "model_label")[: _top(args, "limit")]
        ]

    return await _answer("models", read)


async def model_trend(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        rows = _calls(_days(args))
        if module := str(args.get("module_name") or "").strip():
            rows = rows.filter(purpose=module)
        metric = METRICS[_metric(args.get("metric"))]
        ranking = Count("pk") if metric is METRICS["latency"] else metric
        return _trend(rows, "created_at", "model_label", metric, ranking, _bucket(args), _top(args, "top_models"))

    return await _answer("series", read)


async def token_trend(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        rows, bucket = _calls(_days(args)), _bucket(args)
        if str(args.get("group_by") or "").strip():
            column = GROUPS[_group(args)]
            return _trend(rows, "created_at", column, Sum("tokens"), Sum("tokens"), bucket, _top(args, "top_items"))
        points = list(
            rows.annotate(at=_trunc("created_at", bucket))
            .values("at")
            .annotate(total_tokens=Sum("tokens"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
            .annotate(request_count=Count("pk"))
            .order_by("at")
        )
        values = {
            "total_tokens": [float(p["total_tokens"] or 0) for p in points],
            "prompt_tokens": [float(p["prompt"] or 0) for p in points],
            "completion_tokens": [float(p["completion"] or 0) for p in points],
            "request_count": [float(p["request_count"]) for p in points],
        }
        return {
            "timestamps": [_label(p["at"], bucket) for p in points],
            "values_by_key": values,
            "labels_by_key": {**TOKEN_LABELS, "request_count": "请求次数"},
            "total": sum(values["total_tokens"]),
            "source_count": len(points),
        }

    return await _answer("series", read)


def _pie(counter: Counter, limit: int) -> list[dict[str, Any]]:
    ranked = sorted(counter.items(), key=lambda item: (-item[1], item[0]))
    items: list[dict[str, Any]] = [{"name": k, "value": int(v)} for k, v in ranked[:limit] if v > 0]
    if others := sum(v for _, v in ranked[limit:] if v > 0):
        items.append({"name": "其他", "value": int(others)})
    return items


async def token_distribution(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        group_by, top = _group(args), _top(args, "top_items")
        column = GROUPS[group_by]
        rows = list(_calls(_days(args)).values(column).annotate(tokens_sum=Sum("tokens"), n=Count("pk")))
        tokens = Counter({str(r[column]): int(r["tokens_sum"] or 0) for r in rows})
        requests = Counter({str(r[column]): int(r["n"]) for r in rows})
        name = GROUP_NAMES[group_by]
        pies = [
            {"title": f"Token 按{name}分布", "data": _pie(tokens, top)},
            {"title": f"请求次数按{name}分布", "data": _pie(requests, top)},
        ]
        return {"pies": pies, "total": sum(tokens.values()), "source_count": len(rows)}

    return await _answer("distribution", read)


async def message_trend(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.models import Message

    def read() -> dict[str, Any]:
        days, bucket, top = _days(args), _bucket(args), _top(args, "top_chats")
        label = Coalesce(
            NullIf("session__group_name", Value("")),
            NullIf("session__user_nickname", Value("")),
            F("session__session_id"),
        )
        rows = Message.objects.filter(time__gte=_since(days)).annotate(chat_label=label)
        return _trend(rows, "time", "chat_label", Count("pk"), Count("pk"), bucket, top)

    return await _answer("series", read)


async def tool_trend(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    from chat.models import ToolCallRecord

    def read() -> dict[str, Any]:
        rows = ToolCallRecord.objects.filter(created_at__gte=_since(_days(args)))
        return _trend(rows, "created_at", "name", Count("pk"), Count("pk"), _bucket(args), _top(args, "top_tools"))

    return await _answer("series", read)


def _online_hours(since: datetime, bucket: str) -> dict[str, float]:
    """Hours each bucket had a web process running (overlapping processes count once)."""
    from core.models import ProcessHeartbeat

    spans = sorted(
        (max(start, since), end)
        for start, end in ProcessHeartbeat.objects.filter(role="web", beat_at__gte=since).values_list(
            "started_at", "beat_at"
        )
        if end > since
    )
    merged: list[list[datetime]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    hours: dict[str, float] = {}
    step = timedelta(hours=1)
    for start, end in merged:
        cursor = start
        while cursor < end:
            local = cursor.astimezone(_zone())
            boundary = local.replace(minute=0, second=0, microsecond=0) + step
            piece_end = min(end, boundary)
            label = _label(cursor, bucket)
            hours[label] = hours.get(label, 0.0) + (piece_end - cursor).total_seconds() / 3600
            cursor = piece_end
    return hours


async def online_time_trend(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        hours = _online_hours(_since(_days(args)), _bucket(args))
        timestamps = sorted(hours)
        values = [hours[t] for t in timestamps]
        return {
            "timestamps": timestamps,
            "values_by_key": {"online_hours": values},
            "labels_by_key": {"online_hours": "在线时长(小时)"},
            "total": sum(values),
            "source_count": len(timestamps),
        }

    return await _answer("series", read)
