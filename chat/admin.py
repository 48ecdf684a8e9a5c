"""Operator console for conversations: sessions and their messages read-only and in order, with each
outbound message's delivery (badge, filter, and a resend action for unconfirmed or failed ones); what is
known of each platform's adapter; the planner's cycles with their tool calls and LLM calls; the LLM usage
page (tokens and cost per day, model and session, with a server-drawn SVG chart). These records are
read-only here: they are history.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from chat.fate import (
    FATE_COLOURS,
    NEEDS_ATTENTION,
    RECENT_DELIVERY_HOURS,
    RESENDABLE,
    Fate,
    message_fate,
    outbound_fate_counts,
    recent_delivery_since,
)
from chat.models import AdapterPlatform, ChatSession, DeliveryStatus, LLMCall, Message, PlannerCycle, ToolCallRecord
from chat.services import messages_resend
from core.config import format_instant, get_config

CONVERSATION_TAIL = 200


def badge(colour: str, label: str, title: str = "") -> SafeString:
    """A coloured status pill; `title` (e.g. a failure's reason) shows on hover."""
    return format_html(
        '<span class="mb-badge" title="{}" style="background:{};color:#fff;padding:2px 8px;border-radius:10px;'
        'font-size:11px;white-space:nowrap">{}</span>',
        title,
        colour,
        label,
    )


def fate_badge(fate: str, *, reason: str = "") -> SafeString:
    """A fate's badge, with the reason beside it for an unconfirmed or failed one."""
    pill = badge(FATE_COLOURS.get(fate, "#6b7280"), Fate(fate).label, reason)
    if reason and fate in NEEDS_ATTENTION:
        return format_html('{} <code class="mb-reason">{}</code>', pill, reason)
    return pill


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records, not documents: operators read them; services write them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "platform", "chat_type", "target", "last_active_local", "messages_link", "cycles"]
    list_filter = ["platform", "chat_type"]
    search_fields = ["session_id", "user_id", "user_nickname", "group_id", "group_name"]
    readonly_fields = [
        "session_id", "platform", "chat_type", "user_id", "user_nickname", "user_cardname", "group_id",
        "group_name", "created_at", "last_active_at", "cycles", "conversation",
    ]  # fmt: skip

    @admin.display(description="user / group id")
    def target(self, obj: ChatSession) -> str:
        return obj.target_id

    @admin.display(description="last active", ordering="last_active_at")
    def last_active_local(self, obj: ChatSession) -> str:
        return format_instant(obj.last_active_at, get_config().tzinfo)

    @admin.display(description="messages")
    def messages_link(self, obj: ChatSession) -> str:
        url = reverse("admin:chat_message_changelist") + f"?session__id__exact={obj.pk}"
        return format_html('<a href="{}">messages</a>', url)

    @admin.display(description="planner cycles")
    def cycles(self, obj: ChatSession) -> SafeString:
        count = obj.cycles.count()
        return format_html('<a href="{}">{} cycle{}</a>', cycles_url(obj.pk), count, "" if count == 1 else "s")

    @admin.display(description=f"conversation (last {CONVERSATION_TAIL} messages, oldest first)")
    def conversation(self, obj: ChatSession) -> str:
        tz = get_config().tzinfo
        tail = list(obj.messages.order_by("-time", "-id")[:CONVERSATION_TAIL])[::-1]
        if not tail:
            return "No messages yet."
        nickname = get_config().bot.nickname
        rows = format_html_join(
            "",
            '<div class="mb-msg mb-{}"><span class="mb-time">{}</span> <strong>{}</strong>'
            ' <span class="mb-kind">{}</span><div class="mb-text">{}</div></div>',
            (
                (
                    m.direction,
                    format_instant(m.time, tz),
                    nickname if m.direction == "out" else (m.sender_nickname or m.sender_id),
                    m.source_kind if m.direction == "out" else "",
                    m.text,
                )
                for m in tail
            ),
        )
        style = mark_safe(  # a constant, no user data
            "<style>.mb-msg{padding:4px 8px;margin:2px 0;border-radius:6px;max-width:720px;white-space:pre-wrap}"
            ".mb-in{background:var(--darkened-bg)}.mb-out{background:#e0f2fe;margin-left:60px}"
            ".mb-time,.mb-kind{color:var(--body-quiet-color);font-size:11px}</style>"
        )
        return format_html("{}{}", style, rows)


class DeliveryFilter(admin.SimpleListFilter):
    """An outbound message's fate, and "needs attention" (unconfirmed or failed: nothing retries it)."""

    title = "delivery"
    parameter_name = "delivery"
    ATTENTION = "attention"

    def lookups(self, request, model_admin):
        return [
            (self.ATTENTION, "Needs attention (unconfirmed or failed)"),
            *((s, Fate(s).label) for s in DeliveryStatus.values),
        ]

    def queryset(self, request, queryset):
        if self.value() == self.ATTENTION:
            return queryset.filter(delivery_status__in=NEEDS_ATTENTION)
        if self.value() in DeliveryStatus.values:
            return queryset.filter(delivery_status=self.value())
        return queryset


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["time_local", "session", "direction", "source_kind", "who", "short_text", "delivery"]
    list_filter = ["direction", "source_kind", DeliveryFilter, "session__platform"]
    search_fields = ["text", "platform_message_id", "sender_id", "sender_nickname", "session__session_id"]
    list_select_related = ["session"]
    ordering = ["-time", "-id"]
    date_hierarchy = "time"
    actions = ["resend_selected"]

    @admin.display(description="delivery", ordering="delivery_status")
    def delivery(self, obj: Message) -> SafeString | str:
        fate = message_fate(obj)
        if fate is None:
            return "-"
        return fate_badge(fate, reason=obj.delivery_error)

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.resend_message")

    @admin.action(description="Resend selected (unconfirmed or failed outbound only)", permissions=["resend"])
    def resend_selected(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        resent = messages_resend(message_ids=ids, by=f"operator:{request.user.get_username()}")
        if resent:
            self.message_user(request, f"Put {len(resent)} message(s) back in the outbox.", messages.SUCCESS)
        if skipped := len(ids) - len(resent):
            states = " or ".join(str(Fate(s).label).lower() for s in RESENDABLE)
            self.message_user(
                request, f"Skipped {skipped}: only outbound messages that are {states} can be resent.", messages.WARNING
            )

    @admin.display(description="time", ordering="time")
    def time_local(self, obj: Message) -> str:
        return format_instant(obj.time, get_config().tzinfo)

    @admin.display(description="from")
    def who(self, obj: Message) -> str:
        return get_config().bot.nickname if obj.direction == "out" else (obj.sender_nickname or obj.sender_id)

    @admin.display(description="text")
    def short_text(self, obj: Message) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"


def _platform_count(counts: dict, part: str, state: str, description: str):
    """A list column: one platform's count of outbound messages in `state`, linked to them."""

    @admin.display(description=description)
    def column(obj: AdapterPlatform) -> SafeString:
        found = counts.get(obj.platform)
        n = getattr(found, part)[state] if found is not None else 0
        url = reverse("admin:chat_message_changelist") + f"?delivery={state}&session__platform={obj.platform}"
        return format_html('<a href="{}">{}</a>', url, n)

    return column


@admin.register(AdapterPlatform)
class AdapterPlatformAdmin(ReadOnlyAdmin):
    """What we know of each platform's adapter, and how its outbound messages fared."""

    fields = ["platform", "echoes", "first_echo_at", "last_echo_at", "accept_format", "bot_account", "updated_at"]
    readonly_fields = fields

    @admin.display(boolean=True, description="echoes deliveries")
    def echoes(self, obj: AdapterPlatform) -> bool:
        return obj.echoes

    @admin.display(description="last echo", ordering="last_echo_at")
    def last_echo_local(self, obj: AdapterPlatform) -> str:
        return format_instant(obj.last_echo_at, get_config().tzinfo) if obj.last_echo_at else "-"

    def get_list_display(self, request: HttpRequest):
        # The counts of every platform on the page come from one grouped query per request.
        counts = outbound_fate_counts(since=recent_delivery_since())
        return [
            "platform",
            "echoes",
            "last_echo_local",
            "accept_format",
            "bot_account",
            _platform_count(counts, "recent", DeliveryStatus.DELIVERED, f"delivered ({RECENT_DELIVERY_HOURS} h)"),
            _platform_count(counts, "open", DeliveryStatus.UNCONFIRMED, "unconfirmed"),
            _platform_count(counts, "open", DeliveryStatus.FAILED, "failed"),
        ]


# --- the planner's record ----------------------------------------------------------------------------


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _json(value) -> SafeString:
    return format_html(
        '<pre style="white-space:pre-wrap;margin:0">{}</pre>', json.dumps(value, ensure_ascii=False, indent=1)
    )


def cycles_url(session_pk: int) -> str:
    # o=1: ordered by the first column (started_at) ascending, i.e. the session's cycles in order.
    return f"{reverse('admin:chat_plannercycle_changelist')}?session__id__exact={session_pk}&o=1"


class ToolCallInline(ReadOnlyInline):
    model = ToolCallRecord
    fields = ("round", "name", "tool_call_id", "arguments_view", "result_view", "ok")
    readonly_fields = fields

    @admin.display(description="Arguments")
    def arguments_view(self, obj: ToolCallRecord) -> SafeString:
        if obj.arguments == {} and obj.raw_arguments and obj.raw_arguments.strip() not in ("", "{}"):
            return format_html("<code>{}</code> (not valid JSON)", obj.raw_arguments)
        return _json(obj.arguments)

    @admin.display(description="Result")
    def result_view(self, obj: ToolCallRecord) -> SafeString:
        return _json(obj.result)


class LLMCallInline(ReadOnlyInline):
    model = LLMCall
    fields = (
        "created_at",
        "model",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost",
        "latency_ms",
        "error",
    )
    readonly_fields = fields


@admin.register(PlannerCycle)
class PlannerCycleAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "session", "kind", "action", "replanned", "has_error", "total_ms", "trigger")
    list_filter = ("kind", "action", "replanned", ("session", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("session",)
    search_fields = ("cycle_id", "reasoning", "outcome", "error")
    date_hierarchy = "started_at"
    inlines = (ToolCallInline, LLMCallInline)
    fields = (
        "cycle_id",
        "session_link",
        "kind",
        "trigger",
        "started_at",
        "ended_at",
        "timings_view",
        "action",
        "reasoning",
        "outcome",
        "replanned",
        "error",
        "usage",
        "prompt_view",
    )
    readonly_fields = fields

    @admin.display(boolean=True, description="Error")
    def has_error(self, obj: PlannerCycle) -> bool:
        return bool(obj.error)

    @admin.display(description="Total ms")
    def total_ms(self, obj: PlannerCycle):
        return (obj.timings or {}).get("total_ms")

    @admin.display(description="Session")
    def session_link(self, obj: PlannerCycle) -> SafeString | str:
        if obj.session_id is None:
            return "-"
        return format_html('<a href="{}">{}</a> (all its cycles)', cycles_url(obj.session_id), obj.session)

    @admin.display(description="Timings (ms)")
    def timings_view(self, obj: PlannerCycle) -> SafeString:
        return format_html_join(", ", "{}: {}", sorted((obj.timings or {}).items()))

    @admin.display(description="Tokens and cost")
    def usage(self, obj: PlannerCycle) -> str:
        agg = obj.llm_calls.aggregate(
            calls=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost")
        )
        return (
            f"{agg['calls']} LLM call(s): {agg['prompt'] or 0} prompt + {agg['completion'] or 0} completion tokens, "
            f"cost {agg['cost'] or Decimal(0)}"
        )

    @admin.display(description="Rendered prompt (the conversation sent to the model)")
    def prompt_view(self, obj: PlannerCycle) -> SafeString:
        if not obj.prompt:
            return mark_safe("<em>no model call (offline planner, or failed before the prompt)</em>")
        rows = []
        for message in obj.prompt:
            body = message.get("content") or ""
            if message.get("tool_calls"):
                body = f"{body}\n" + json.dumps(message["tool_calls"], ensure_ascii=False, indent=1)
            label = message.get("role", "?")
            if message.get("tool_call_id"):
                label += f" ({message['tool_call_id']})"
            rows.append((label, body.strip()))
        return format_html_join(
            "",
            '<div class="prompt-message"><strong>{}</strong>'
            '<pre style="white-space:pre-wrap;border-left:3px solid #ccc;padding-left:8px">{}</pre></div>',
            rows,
        )


# --- LLM usage ------------------------------------------------------------------------------------


def usage_chart_svg(days: list[dict], width: int = 760, height: int = 220) -> SafeString:
    """Stacked bars (prompt / completion tokens) per day as inline SVG: no JS, no CDN."""
    pad_l, pad_b, pad_t = 60, 30, 10
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    peak = max((d["prompt_tokens"] + d["completion_tokens"] for d in days), default=0) or 1
    step = plot_w / max(len(days), 1)
    bar = max(step * 0.7, 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="Tokens per day" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" style="font:11px sans-serif">',
        f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{width - 10}" y2="{pad_t + plot_h}" stroke="#888"/>',
        f'<text x="{pad_l - 6}" y="{pad_t + 8}" text-anchor="end">{peak}</text>',
        f'<text x="{pad_l - 6}" y="{pad_t + plot_h}" text-anchor="end">0</text>',
    ]
    label_every = max(1, round(len(days) / 10))
    for i, d in enumerate(days):
        x = pad_l + i * step + (step - bar) / 2
        p_h = plot_h * d["prompt_tokens"] / peak
        c_h = plot_h * d["completion_tokens"] / peak
        y_p = pad_t + plot_h - p_h
        day = d["day"].isoformat()
        tip = f"{day}: {d['prompt_tokens']} prompt, {d['completion_tokens']} completion tokens, cost {d['cost']}"
        parts.append(
            f'<g class="bar"><title>{tip}</title>'
            f'<rect x="{x:.1f}" y="{y_p:.1f}" width="{bar:.1f}" height="{p_h:.1f}" fill="#417690"/>'
            f'<rect x="{x:.1f}" y="{y_p - c_h:.1f}" width="{bar:.1f}" height="{c_h:.1f}" fill="#f5a623"/></g>'
        )
        if i % label_every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 12}" text-anchor="middle">{d["day"]:%m-%d}</text>')
    parts.append(
        f'<rect x="{width - 190}" y="{pad_t}" width="10" height="10" fill="#417690"/>'
        f'<text x="{width - 176}" y="{pad_t + 9}">prompt</text>'
        f'<rect x="{width - 120}" y="{pad_t}" width="10" height="10" fill="#f5a623"/>'
        f'<text x="{width - 106}" y="{pad_t + 9}">completion</text></svg>'
    )
    # Every interpolated value above is a number, a date or a Decimal: nothing user-controlled.
    return mark_safe("".join(parts))


_SUMS = {
    "calls": Count("id"),
    "prompt_tokens": Sum("prompt_tokens", default=0),
    "cached_tokens": Sum("cached_tokens", default=0),
    "completion_tokens": Sum("completion_tokens", default=0),
    "cost": Sum("cost", default=Decimal(0)),
}


def usage_summary(*, days: int) -> dict:
    """Token and cost sums of the last `days` days, per day (in the bot's time zone), model and session."""
    tz = get_config().tzinfo
    today = timezone.now().astimezone(tz).date()
    first_day = today - timedelta(days=days - 1)
    since = timezone.make_aware(timezone.datetime(first_day.year, first_day.month, first_day.day), tz)
    calls = LLMCall.objects.filter(created_at__gte=since)
    by_day = {
        row["day"]: row
        for row in calls.annotate(day=TruncDate("created_at", tzinfo=tz))
        .values("day")
        .annotate(**_SUMS, errors=Count("id", filter=~Q(error="")))
        .order_by("day")
    }
    per_day = [
        by_day.get(
            first_day + timedelta(days=i),
            {"day": first_day + timedelta(days=i), **dict.fromkeys(_SUMS, 0), "cost": Decimal(0), "errors": 0},
        )
        for i in range(days)
    ]
    per_model = list(calls.values("model", "purpose").annotate(**_SUMS).order_by("-cost", "-prompt_tokens"))
    per_session = list(calls.values("session").annotate(**_SUMS).order_by("-cost", "-prompt_tokens")[:50])
    names = ChatSession.objects.in_bulk([r["session"] for r in per_session if r["session"]])
    for row in per_session:
        row["label"] = str(names.get(row["session"], row["session"]))
    totals = calls.aggregate(**_SUMS)
    return {
        "since": since,
        "tz": tz.key,
        "per_day": per_day,
        "per_model": per_model,
        "per_session": per_session,
        "totals": totals,
    }


@admin.register(LLMCall)
class LLMCallAdmin(ReadOnlyAdmin):
    list_display = (
        "created_at",
        "purpose",
        "model",
        "session",
        "cycle",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "cost",
        "latency_ms",
        "has_error",
    )
    list_filter = ("purpose", "model")
    list_select_related = ("session", "cycle")
    date_hierarchy = "created_at"

    @admin.display(boolean=True, description="Error")
    def has_error(self, obj: LLMCall) -> bool:
        return bool(obj.error)

    def get_urls(self):
        view = self.admin_site.admin_view(self.usage_view)
        return [path("usage/", view, name="chat_llmcall_usage"), *super().get_urls()]

    def usage_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            days = min(max(int(request.GET.get("days", 30)), 1), 366)
        except ValueError:
            days = 30
        summary = usage_summary(days=days)
        context = {
            **self.admin_site.each_context(request),
            "title": "LLM usage",
            "days": days,
            "chart": usage_chart_svg(summary["per_day"]),
            **summary,
        }
        return TemplateResponse(request, "admin/chat/usage.html", context)
