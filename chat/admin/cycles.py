"""The planner's record in the admin: cycles with their tool calls and LLM calls."""

import json
from decimal import Decimal

from django.contrib import admin
from django.db.models import Count, Sum
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from chat.admin.base import ReadOnlyAdmin, ReadOnlyInline, error_badge, json_block
from chat.models import LLMCall, PlannerCycle, ToolCallRecord


def cycles_url(session_pk: int) -> str:
    # o=1: ordered by the first column (started_at) ascending, i.e. the session's cycles in order.
    return f"{reverse('admin:chat_plannercycle_changelist')}?session__id__exact={session_pk}&o=1"


class ToolCallInline(ReadOnlyInline):
    model = ToolCallRecord
    fields = ("round", "name", "tool_call_id", "arguments_view", "result_view", "ok")
    readonly_fields = fields

    @admin.display(description=_("Arguments"))
    def arguments_view(self, obj: ToolCallRecord) -> SafeString:
        if obj.arguments == {} and obj.raw_arguments and obj.raw_arguments.strip() not in ("", "{}"):
            return format_html("<code>{}</code> {}", obj.raw_arguments, gettext("(not valid JSON)"))
        return json_block(obj.arguments)

    @admin.display(description=_("Result"))
    def result_view(self, obj: ToolCallRecord) -> SafeString:
        return json_block(obj.result)


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

    @admin.display(description=_("Error"), ordering="error")
    def has_error(self, obj: PlannerCycle) -> SafeString | str:
        return error_badge(obj.error)

    @admin.display(description=_("Total ms"))
    def total_ms(self, obj: PlannerCycle):
        return (obj.timings or {}).get("total_ms")

    @admin.display(description=_("Session"))
    def session_link(self, obj: PlannerCycle) -> SafeString | str:
        if obj.session_id is None:
            return "-"
        return format_html(
            '<a href="{}">{}</a> {}', cycles_url(obj.session_id), obj.session, gettext("(all its cycles)")
        )

    @admin.display(description=_("Timings (ms)"))
    def timings_view(self, obj: PlannerCycle) -> SafeString:
        return format_html_join(", ", "{}: {}", sorted((obj.timings or {}).items()))

    @admin.display(description=_("Tokens and cost"))
    def usage(self, obj: PlannerCycle) -> str:
        agg = obj.llm_calls.aggregate(
            calls=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost")
        )
        text = ngettext(
            "%(calls)d LLM call: %(prompt)d prompt + %(completion)d completion tokens, cost %(cost)s",
            "%(calls)d LLM calls: %(prompt)d prompt + %(completion)d completion tokens, cost %(cost)s",
            agg["calls"],
        )
        return text % {
            "calls": agg["calls"],
            "prompt": agg["prompt"] or 0,
            "completion": agg["completion"] or 0,
            "cost": agg["cost"] or Decimal(0),
        }

    @admin.display(description=_("Rendered prompt (the conversation sent to the model)"))
    def prompt_view(self, obj: PlannerCycle) -> SafeString:
        if not obj.prompt:
            return format_html("<em>{}</em>", gettext("no model call (offline planner, or failed before the prompt)"))
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
