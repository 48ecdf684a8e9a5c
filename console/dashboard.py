"""The console dashboard's reads (selectors): adapters, runtimes, scheduled work, the fate of outbound
messages (per adapter platform), lateness, LLM usage, recent errors, and the health checks /healthz reports."""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections import defaultdict
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.db import connection
from django.db.models import Count, F, Max, Q, Sum
from django.db.models.functions import Now, TruncDate, TruncHour
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _

from chat.accounts import bot_account
from chat.agent.budget import budget_states
from chat.fate import (
    NEEDS_ATTENTION,
    RECENT_DELIVERY_HOURS,
    outbound_fate_counts,
    recent_delivery_since,
    sender_fate,
    sender_fate_expression,
    sender_fate_q,
)
from chat.models import AdapterConnection, ChatSession, CycleKind, Direction, LLMCall, Message, PlannerCycle
from console import charts
from core.config import get_config
from core.models import LogEntry, ProcessHeartbeat
from scheduling.models import ScheduledMessage, ScheduledStatus


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of unsorted values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def connected_adapters() -> list[AdapterConnection]:
    """Open adapter connections (websocket clients and adapter plugins' gateways, protocol "plugin"), each
    with `account`: the bot's account on its platform (chat.accounts; "" when none is known)."""
    adapters = list(AdapterConnection.objects.filter(disconnected_at__isnull=True).order_by("platform", "connected_at"))
    for adapter in adapters:
        adapter.account = bot_account(adapter.platform)
    return adapters


def active_runtimes() -> dict[str, Any]:
    """Live session loops. The registry lives in the ASGI process (chat.runtime, when installed);
    without it, sessions with a planner cycle within the idle-eviction window are counted."""
    if importlib.util.find_spec("chat.runtime") is not None:
        # Imported here, not at module level: the planner's registry is optional for the console.
        registry = getattr(importlib.import_module("chat.runtime"), "registry", None)
        runtimes = getattr(registry, "runtimes", None)
        if isinstance(runtimes, dict):
            return {"count": len(runtimes), "source": _("runtime registry of this server")}
    since = timezone.now() - timedelta(seconds=get_config().chat.idle_evict_seconds)
    count = (
        PlannerCycle.objects.filter(kind=CycleKind.CHAT, started_at__gte=since, session__isnull=False)
        .values("session")
        .distinct()
        .count()
    )
    return {"count": count, "source": _("sessions with a planner cycle in the idle window")}


SCHEDULED_SHOWN = ("pending", "sending", "unconfirmed", "failed")


def scheduled_counts() -> dict[str, int]:
    """Scheduled messages by fate: a sent one counts as what became of its outbound message."""
    rows = (
        ScheduledMessage.objects.filter(sender_fate_q("sent_message", "status", SCHEDULED_SHOWN))
        .annotate(fate=sender_fate_expression("sent_message", "status"))
        .values_list("fate")
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts = dict.fromkeys(SCHEDULED_SHOWN, 0)
    counts.update(dict(rows))
    return counts


def delivery_counts() -> dict[str, Any]:
    """Outbound messages per delivery state, in all and per adapter platform: the last day's, and every
    one still unconfirmed or failed however old."""
    counts = outbound_fate_counts(since=recent_delivery_since())
    total = counts.pop("")
    return {"hours": RECENT_DELIVERY_HOURS, "total": total, "platforms": sorted(counts.items())}


def recent_chats(limit: int = 8) -> list[ChatSession]:
    """The most recently active conversations, newest first (each links to its transcript)."""
    return list(ChatSession.objects.order_by("-last_active_at")[:limit])


def next_due(limit: int = 10) -> list[ScheduledMessage]:
    return list(
        ScheduledMessage.objects.filter(status=ScheduledStatus.PENDING)
        .select_related("session")
        .order_by("due_at")[:limit]
    )


def timer_model():
    """The life loop's Timer model when that app has it (it may land later than the console)."""
    try:
        return apps.get_model("scheduling", "Timer")
    except LookupError:
        return None


def timers_summary(limit: int = 10) -> dict[str, Any] | None:
    Timer = timer_model()
    if Timer is None:
        return None
    names = {f.name for f in Timer._meta.get_fields()}
    due_field = next((f for f in ("next_fire", "due_at", "fire_at", "next_fire_at") if f in names), None)
    qs = Timer.objects.all()
    counts: dict[str, int] = {}
    if "status" in names:
        labels = dict(Timer._meta.get_field("status").flatchoices)  # each state by its name on the page
        counts = {str(labels.get(s, s)): n for s, n in qs.values_list("status").annotate(n=Count("pk"))}
        qs = qs.filter(status__in=["active", "pending"])
    upcoming = list(qs.filter(**{f"{due_field}__isnull": False}).order_by(due_field)[:limit]) if due_field else []
    return {"counts": counts, "upcoming": [(t, getattr(t, due_field)) for t in upcoming], "due_field": due_field}


def lateness_stats(now: datetime | None = None) -> dict[str, Any]:
    """p50/p99 of sent_at - send_at (seconds) over the last hour and day, and per hour of the day."""
    now = now or timezone.now()
    rows = list(
        ScheduledMessage.objects.filter(status=ScheduledStatus.SENT, sent_at__gte=now - timedelta(days=1)).values_list(
            "send_at", "sent_at"
        )
    )
    day = [(sent_at, (sent_at - send_at).total_seconds()) for send_at, sent_at in rows]
    hour = [v for t, v in day if t >= now - timedelta(hours=1)]
    all_day = [v for _, v in day]
    buckets: list[list[float]] = [[] for _ in range(24)]
    for t, v in day:
        idx = 23 - min(23, int((now - t).total_seconds() // 3600))
        buckets[idx].append(v)
    return {
        "hour": {"count": len(hour), "p50": percentile(hour, 50), "p99": percentile(hour, 99)},
        "day": {"count": len(all_day), "p50": percentile(all_day, 50), "p99": percentile(all_day, 99)},
        "hourly_p50": [percentile(b, 50) for b in buckets],
        "hourly_p99": [percentile(b, 99) for b in buckets],
    }


def lateness_charts(stats: dict[str, Any], now: datetime | None = None) -> list:
    ms = [
        charts.Series(f"p{q}", [round((stats[w][f"p{q}"] or 0) * 1000, 1) for w in ("hour", "day")]) for q in (50, 99)
    ]
    now = timezone.localtime(now or timezone.now(), get_config().tzinfo)
    labels = [(now - timedelta(hours=23 - i)).strftime("%H:00") for i in range(24)]
    return [
        charts.bar_chart(
            title=_("Delivery lateness (sent_at − send_at), ms"),
            categories=[_("last hour"), _("last day")],
            series=ms,
            unit="",
        ),
        charts.line_chart(
            title=_("Delivery lateness per hour, ms"),
            labels=labels,
            series=[
                charts.Series(name, [None if v is None else round(v * 1000, 1) for v in stats[key]])
                for name, key in (("p50", "hourly_p50"), ("p99", "hourly_p99"))
            ],
        ),
    ]


def message_volume(now: datetime | None = None) -> dict[str, Any]:
    """Messages per platform in each of the last 24 hours (the bot's time zone, the current hour last),
    received and sent (replies, scheduled and proactive messages): {"hours": [hour start, ...],
    "in"|"out": {platform: [count per hour]}}. Counted by the database, by the message's time."""
    tz = get_config().tzinfo
    now = timezone.localtime(now or timezone.now(), tz)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    hours = [first + timedelta(hours=i) for i in range(24)]
    index = {hour: i for i, hour in enumerate(hours)}
    volume: dict[str, dict[str, list[int]]] = {Direction.IN: {}, Direction.OUT: {}}
    rows = (
        Message.objects.filter(time__gte=first)
        .annotate(hour=TruncHour("time", tzinfo=tz))
        .values("hour", "direction", "session__platform")
        .annotate(n=Count("id"))
    )
    for row in rows:
        i = index.get(timezone.localtime(row["hour"], tz))
        if i is not None and row["direction"] in volume:
            counts = volume[row["direction"]].setdefault(row["session__platform"], [0] * 24)
            counts[i] += row["n"]
    return {"hours": hours, "in": volume[Direction.IN], "out": volume[Direction.OUT]}


def volume_charts(volume: dict[str, Any]) -> list:
    """Two stacked bar charts: messages received, and sent, per hour and platform."""
    labels = [hour.strftime("%H:00") for hour in volume["hours"]]
    zone = volume["hours"][-1].tzname() or ""
    made = []
    for key, title in (
        ("in", _("Messages received per hour and platform (%(zone)s)")),
        ("out", _("Messages sent per hour and platform: replies, scheduled and proactive (%(zone)s)")),
    ):
        series = [charts.Series(platform, counts) for platform, counts in sorted(volume[key].items())]
        title = title % {"zone": zone}
        if series:
            made.append(charts.bar_chart(title=title, categories=labels, series=series, stacked=True, counts=True))
        else:
            made.append(format_html('<p class="chart-empty">{}: {}</p>', title, charts.no_data()))
    return made


def _totals() -> dict[str, Any]:
    """The LLM-call aggregates every usage table shows: tokens (prompt, completion, cached), cost, calls."""
    return {
        "prompt": Sum("prompt_tokens"),
        "completion": Sum("completion_tokens"),
        "cached": Sum("cached_tokens"),
        "cost": Sum("cost"),
        "calls": Count("id"),
    }


def _llm_per_day(by: str, empty: str, days: int, now: datetime | None) -> dict[str, Any]:
    """Tokens and cost per day (bot time zone) and `by` (a ledger field; `empty` labels its blank value)
    over the last `days` days: the chart series and the table rows."""
    tz = get_config().tzinfo
    now = now or timezone.now()
    today = timezone.localtime(now, tz).date()
    first = today - timedelta(days=days - 1)
    rows = (
        LLMCall.objects.filter(created_at__gte=now - timedelta(days=days + 1))
        .annotate(day=TruncDate("created_at", tzinfo=tz))
        .filter(day__gte=first)
        .values("day", by)
        .annotate(**_totals(), errors=Count("id", filter=~Q(error="")))
        .order_by("day", by)
    )
    tokens: dict[str, dict[date, int]] = defaultdict(lambda: defaultdict(int))
    cost: dict[str, dict[date, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    table = []
    for row in rows:
        key = row[by] or empty
        tokens[key][row["day"]] += (row["prompt"] or 0) + (row["completion"] or 0)
        cost[key][row["day"]] += row["cost"] or Decimal(0)
        table.append({**row, by: key})
    return {
        "days": [first + timedelta(days=i) for i in range(days)],
        "tokens": tokens,
        "cost": cost,
        "table": table,
        "today": today,
        "tz": tz,
    }


def llm_usage(days: int = 14, now: datetime | None = None) -> dict[str, Any]:
    """Tokens and cost per day (bot time zone) and model over the last `days` days."""
    usage = _llm_per_day("model", "(none)", days, now)
    return {k: usage[k] for k in ("days", "tokens", "cost", "table")}


def llm_spend(days: int = 14, now: datetime | None = None) -> dict[str, Any]:
    """Spend per feature: tokens and cost per day (bot time zone) and task over the last `days` days,
    the chats that spent most today, and today's budgets against their caps."""
    # "(unrecorded)": calls made before tasks were recorded.
    spend = _llm_per_day("task", "(unrecorded)", days, now)
    return {
        **{k: spend[k] for k in ("days", "tokens", "cost", "table")},
        "sessions_today": _top_sessions(spend["today"], spend["tz"]),
        "budgets": budget_states(),
    }


def _top_sessions(day: date, tz, limit: int = 10) -> list[dict[str, Any]]:
    """The chats that spent the most tokens on `day` (local), with their cost and cached prompt tokens."""
    start = datetime.combine(day, datetime.min.time(), tzinfo=tz)
    rows = list(
        LLMCall.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1), session__isnull=False)
        .values("session")
        .annotate(**_totals())
        .annotate(tokens=F("prompt") + F("completion"))
        .order_by("-tokens", "session")[:limit]
    )
    sessions = ChatSession.objects.in_bulk([r["session"] for r in rows])
    return [{**r, "session": sessions.get(r["session"])} for r in rows]


def llm_charts(usage: dict[str, Any]) -> list:
    labels = [d.strftime("%m-%d") for d in usage["days"]]
    models = sorted(usage["tokens"])
    return [
        charts.bar_chart(
            title=_("LLM tokens per day and model"),
            categories=labels,
            series=[charts.Series(m, [usage["tokens"][m][d] for d in usage["days"]]) for m in models],
            stacked=True,
            counts=True,
        ),
        charts.bar_chart(
            title=_("LLM cost per day and model, in the currency of the models' prices"),
            categories=labels,
            series=[charts.Series(m, [float(usage["cost"][m][d]) for d in usage["days"]]) for m in models],
            stacked=True,
        ),
    ]


def recent_errors(limit: int = 10) -> dict[str, list]:
    return {
        "scheduled": [
            (task, sender_fate(task.status, task.sent_message), task.last_error or task.sent_message.delivery_error)
            for task in ScheduledMessage.objects.filter(sender_fate_q("sent_message", "status", NEEDS_ATTENTION))
            .select_related("session", "sent_message")
            .order_by("-updated_at")[:limit]
        ],
        "outbound": list(
            Message.objects.filter(delivery_status__in=NEEDS_ATTENTION)
            .select_related("session")
            .order_by("-id")[:limit]
        ),
        "llm": list(LLMCall.objects.exclude(error="").order_by("-created_at")[:limit]),
        "log": list(LogEntry.objects.filter(level__gte=40).order_by("-id")[: limit * 2]),
    }


def processes() -> list[ProcessHeartbeat]:
    """The processes running now: those whose heartbeat still vouches for them. A process stopped cleanly
    deletes its row; one that died leaves a row until the others sweep it, past its `alive_until`, and is
    not listed as running meanwhile. (A row without `alive_until`, of an older version's process, counts
    while it beat within the last minute.)"""
    return list(
        ProcessHeartbeat.objects.filter(
            Q(alive_until__gte=Now()) | Q(alive_until__isnull=True, beat_at__gte=timezone.now() - timedelta(minutes=1))
        )
    )


# --- health ---------------------------------------------------------------------------------------


def health_checks(now: datetime | None = None) -> tuple[bool, dict[str, Any]]:
    """(healthy, checks) for /healthz: the database answers, a cluster beat recently, and (when the
    config asks for it) an adapter is connected. Counts and ages only: nothing secret."""
    cfg = get_config().console
    now = now or timezone.now()
    checks: dict[str, Any] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": type(exc).__name__}
        return False, checks
    try:
        last = ProcessHeartbeat.objects.filter(role=ProcessHeartbeat.Role.CLUSTER).aggregate(at=Max("beat_at"))["at"]
        age = (now - last).total_seconds() if last else None
        checks["cluster"] = {
            "ok": age is not None and age <= cfg.cluster_stale_seconds,
            "last_heartbeat": last.isoformat() if last else None,
            "age_seconds": round(age, 1) if age is not None else None,
        }
    except Exception as exc:
        checks["cluster"] = {"ok": False, "error": type(exc).__name__}
    try:
        open_rows = AdapterConnection.objects.filter(disconnected_at__isnull=True)
        platforms = sorted(set(open_rows.values_list("platform", flat=True)))
        checks["adapters"] = {
            "ok": bool(platforms) or not cfg.health_requires_adapter,
            "connected_platforms": platforms,
            # How each platform is connected (ws, socketio, plugin) and the bot's account there.
            "connections": [
                {"platform": p, "protocol": protocol, "account": bot_account(p) or None}
                for p, protocol in open_rows.order_by("platform", "connected_at").values_list("platform", "protocol")
            ],
            "required": cfg.health_requires_adapter,
        }
    except Exception as exc:
        checks["adapters"] = {"ok": False, "error": type(exc).__name__}
    return all(c["ok"] for c in checks.values()), checks
