"""The LLM usage page: tokens and cost per day, model and session, with a server-drawn SVG chart."""

from datetime import timedelta
from decimal import Decimal

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDate
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from chat.admin.base import ReadOnlyAdmin, error_badge
from chat.models import ChatSession, LLMCall
from core.config import get_config


def usage_chart_svg(days: list[dict], width: int = 760, height: int = 220) -> SafeString:
    """Stacked bars (prompt / completion tokens) per day as inline SVG: no JS, no CDN."""
    pad_l, pad_b, pad_t = 60, 30, 10
    plot_w, plot_h = width - pad_l - 10, height - pad_b - pad_t
    peak = max((d["prompt_tokens"] + d["completion_tokens"] for d in days), default=0) or 1
    step = plot_w / max(len(days), 1)
    bar = max(step * 0.7, 1)
    prompt, completion = escape(gettext("prompt")), escape(gettext("completion"))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(gettext("Tokens per day"))}" '
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
        tip = escape(
            gettext("{day}: {prompt} prompt, {completion} completion tokens, cost {cost}").format(
                day=day, prompt=d["prompt_tokens"], completion=d["completion_tokens"], cost=d["cost"]
            )
        )
        parts.append(
            f'<g class="bar"><title>{tip}</title>'
            f'<rect x="{x:.1f}" y="{y_p:.1f}" width="{bar:.1f}" height="{p_h:.1f}" fill="#417690"/>'
            f'<rect x="{x:.1f}" y="{y_p - c_h:.1f}" width="{bar:.1f}" height="{c_h:.1f}" fill="#f5a623"/></g>'
        )
        if i % label_every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 12}" text-anchor="middle">{d["day"]:%m-%d}</text>')
    parts.append(
        f'<rect x="{width - 190}" y="{pad_t}" width="10" height="10" fill="#417690"/>'
        f'<text x="{width - 176}" y="{pad_t + 9}">{prompt}</text>'
        f'<rect x="{width - 120}" y="{pad_t}" width="10" height="10" fill="#f5a623"/>'
        f'<text x="{width - 106}" y="{pad_t + 9}">{completion}</text></svg>'
    )
    # Every interpolated value above is a number, a date, a Decimal or an escaped catalog text.
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

    @admin.display(description=_("Error"), ordering="error")
    def has_error(self, obj: LLMCall) -> SafeString | str:
        return error_badge(obj.error)

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
            "title": _("LLM usage"),
            "app_name": self.opts.app_config.verbose_name,
            "calls_name": self.opts.verbose_name_plural,
            "days": days,
            "chart": usage_chart_svg(summary["per_day"]),
            **summary,
        }
        return TemplateResponse(request, "admin/chat/usage.html", context)
