"""Operator console for the life loop: timers, the inner state and its history, memory slots,
summaries and life-loop turns (read-only). Every change goes through the timer and memory services."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from chat.admin import ReadOnlyAdmin, ReadOnlyInline
from chat.models import CycleKind, LLMCall, ToolCallRecord
from core.config import format_shown, get_config
from scheduling.admin_actions import ServiceActionsMixin, operator, status_badge
from scheduling.life.error_codes import LifeError
from scheduling.life.memory import inner_state_get, inner_state_update, memory_slot_forget, memory_slot_set
from scheduling.life.models import (
    InnerState,
    InnerStateRevision,
    LifeTurn,
    MemorySlot,
    SessionSummary,
    Timer,
    TimerStatus,
)
from scheduling.life.timers import (
    timer_cancel,
    timer_clean_fields,
    timer_create,
    timer_fire_now,
    timer_first_fire,
    timer_spec,
    timer_upcoming,
    timer_update,
)

# Each timer state in the colour of the fate it resembles.
TIMER_COLOURS = {
    TimerStatus.ACTIVE: "pending",
    TimerStatus.DONE: "delivered",
    TimerStatus.CANCELLED: "cancelled",
    TimerStatus.FAILED: "failed",
}


def local(value) -> str:
    return format_shown(value, get_config().tzinfo) if value else "-"


def _table(headers: list[str], rows: list[list]) -> str:
    if not rows:
        return "-"
    head = format_html_join("", "<th>{}</th>", ((h,) for h in headers))
    body = format_html_join(
        "", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((c,) for c in row)),) for row in rows)
    )
    return format_html("<table><tr>{}</tr>{}</table>", head, body)


# --- timers ---------------------------------------------------------------------------------------


class TimerForm(forms.ModelForm):
    """Spec, label and payload, validated by the timer services (the spec in the bot's time zone)."""

    class Meta:
        model = Timer
        fields = ["session", "spec", "label", "payload"]

    def clean_spec(self):
        spec = (self.cleaned_data.get("spec") or "").strip()
        if self.instance.pk and spec == self.instance.spec:
            return spec
        try:
            timer_first_fire(timer_spec(spec), timezone.now())
        except LifeError as exc:
            raise ValidationError(exc.message, code=str(exc.code)) from None
        return spec

    def clean(self):
        data = super().clean()
        try:
            data["label"], data["payload"] = timer_clean_fields(data.get("label", ""), data.get("payload", ""))
        except LifeError as exc:
            raise ValidationError(exc.message, code=str(exc.code)) from None
        return data


@admin.register(Timer)
class TimerAdmin(ServiceActionsMixin, admin.ModelAdmin):
    action_errors = (LifeError,)
    action_noun = _("timer(s)")
    form = TimerForm
    list_display = ["id", "label", "badge", "spec", "next_fire_local", "session", "fire_count", "last_fired_local"]
    list_filter = ["status", "kind", "created_via"]
    search_fields = ["id", "label", "payload", "spec", "session__session_id", "session__user_nickname"]
    list_select_related = ["session"]
    raw_id_fields = ["session"]
    ordering = ["status", "next_fire"]
    actions = ["cancel_selected", "fire_now_selected"]
    readonly_fields = [
        "id", "kind", "status", "next_fire_local", "upcoming", "last_fired_local", "fire_count", "last_error",
        "created_at", "updated_at", "created_via", "created_by_tool_call_id", "created_by_user", "cancelled_at",
        "recent_firings",
    ]  # fmt: skip

    def get_fieldsets(self, request, obj=None):
        main = ["session", "spec", "label", "payload"] if obj is None else ["id", "session", "spec", "label", "payload"]
        if obj is None:
            return [(None, {"fields": main, "description": self._spec_help()})]
        return [
            (None, {"fields": main, "description": self._spec_help()}),
            (_("Firing"), {"fields": ["kind", "status", "next_fire_local", "upcoming", "last_fired_local", "fire_count",
                                   "last_error", "recent_firings"]}),
            (_("Audit"), {"fields": ["created_at", "updated_at", "created_via", "created_by_tool_call_id",
                                  "created_by_user", "cancelled_at"]}),
        ]  # fmt: skip

    @staticmethod
    def _spec_help() -> str:
        return gettext(
            "Spec: 5min / 2小时 (once, after that delay), every:1h (repeats), once:2026-04-10 09:00, "
            "cron:0 8 * * * — times in %(zone)s. A payload starting with say: is sent as written."
        ) % {"zone": get_config().tzinfo}

    def get_readonly_fields(self, request, obj=None):
        fields = list(self.readonly_fields)
        if obj is not None:
            fields.append("session")  # a timer stays with its chat
        return fields

    @admin.display(description=_("status"), ordering="status")
    def badge(self, obj: Timer) -> str:
        return status_badge(TIMER_COLOURS.get(obj.status, ""), obj.get_status_display())

    @admin.display(description=_("next fire (bot time)"), ordering="next_fire")
    def next_fire_local(self, obj: Timer) -> str:
        return local(obj.next_fire)

    @admin.display(description=_("last fired"), ordering="last_fired_at")
    def last_fired_local(self, obj: Timer) -> str:
        return local(obj.last_fired_at)

    @admin.display(description=_("next fires"))
    def upcoming(self, obj: Timer) -> str:
        fires = timer_upcoming(obj, count=5)
        return format_html_join("", "<div>{}</div>", ((local(f),) for f in fires)) if fires else "-"

    @admin.display(description=_("recent firings"))
    def recent_firings(self, obj: Timer) -> str:
        rows = []
        for f in obj.firings.select_related("cycle").order_by("-due_at")[:20]:
            turn = (
                format_html(
                    '<a href="{}">{}</a>',
                    reverse("admin:scheduling_lifeturn_change", args=[f.cycle_id]),
                    f.outcome or gettext("turn"),
                )
                if f.cycle_id
                else f.outcome or "-"
            )
            rows.append(
                [local(f.due_at), f"{f.lateness_seconds * 1000:.0f} ms", f.get_status_display(), turn, f.error[:200]]
            )
        return _table([_("due"), _("lateness"), _("status"), _("turn"), _("error")], rows)

    def has_change_permission(self, request: HttpRequest, obj: Timer | None = None) -> bool:
        if obj is not None and obj.status != TimerStatus.ACTIVE:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Timer | None = None) -> bool:
        return False  # cancel instead: the timer stays as history

    def save_model(self, request, obj: Timer, form, change: bool) -> None:
        by = operator(request)
        data = form.cleaned_data
        try:
            if change:
                timer = timer_update(
                    timer_id=obj.pk, spec=data["spec"], label=data["label"], payload=data["payload"], acted_by=by
                )
            else:
                timer = timer_create(
                    spec=data["spec"],
                    label=data["label"],
                    payload=data["payload"],
                    session=data.get("session"),
                    acted_by=by,
                )
                obj.pk = timer.pk
                obj._state.adding = False
        except LifeError as exc:
            self.message_user(request, gettext("Not saved: %(error)s") % {"error": exc.message}, messages.ERROR)
            return
        self.message_user(request, gettext("Next fire: %(time)s") % {"time": local(timer.next_fire)}, messages.INFO)

    def has_fire_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("scheduling.fire_timer")

    @admin.action(description=_("Cancel selected (active only)"), permissions=["change"])
    def cancel_selected(self, request, queryset: QuerySet[Timer]) -> None:
        by = operator(request)
        self._each(request, queryset, lambda t: timer_cancel(timer_id=t.pk, acted_by=by), gettext("Cancelled"))

    @admin.action(description=_("Fire selected now (active only)"), permissions=["fire"])
    def fire_now_selected(self, request, queryset: QuerySet[Timer]) -> None:
        by = operator(request)
        self._each(request, queryset, lambda t: timer_fire_now(timer_id=t.pk, acted_by=by), gettext("Fired"))


# --- inner state ----------------------------------------------------------------------------------


class InnerStateForm(forms.ModelForm):
    class Meta:
        model = InnerState
        fields = ["text"]
        widgets = {"text": forms.Textarea(attrs={"rows": 10, "cols": 100})}

    def clean_text(self):
        text = (self.cleaned_data.get("text") or "").strip()
        limit = get_config().life.inner_state_max_length
        if len(text) > limit:
            raise ValidationError(
                gettext("%(length)d characters; the limit is %(limit)d") % {"length": len(text), "limit": limit}
            )
        return text


@admin.register(InnerState)
class InnerStateAdmin(admin.ModelAdmin):
    """One row: the changelist opens it; saving writes a revision with the operator's name."""

    form = InnerStateForm
    fields = ["text", "updated_at_local", "updated_by", "revisions"]
    readonly_fields = ["updated_at_local", "updated_by", "revisions"]

    def changelist_view(self, request, extra_context=None):
        return HttpResponseRedirect(reverse("admin:scheduling_innerstate_change", args=[inner_state_get().pk]))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.display(description=_("updated at"))
    def updated_at_local(self, obj: InnerState) -> str:
        return local(obj.updated_at)

    @admin.display(description=_("history"))
    def revisions(self, obj: InnerState) -> str:
        rows = []
        for rev in InnerStateRevision.objects.select_related("user").order_by("-created_at", "-id")[:50]:
            who = rev.via + (f" ({rev.user.get_username()})" if rev.user else "")
            turn = (
                format_html(
                    '<a href="{}">{}</a>', reverse("admin:scheduling_lifeturn_change", args=[rev.cycle_id]), _("turn")
                )
                if rev.cycle_id
                else ""
            )
            rows.append([local(rev.created_at), who, turn, rev.text[:300], rev.previous_text[:300]])
        return _table([_("when"), _("by"), "", _("new text"), _("previous text")], rows)

    def save_model(self, request, obj: InnerState, form, change: bool) -> None:
        try:
            inner_state_update(text=form.cleaned_data["text"], via="operator", user=request.user)
        except LifeError as exc:
            self.message_user(request, gettext("Not saved: %(error)s") % {"error": exc.message}, messages.ERROR)


# --- memory ---------------------------------------------------------------------------------------


class MemorySlotForm(forms.ModelForm):
    class Meta:
        model = MemorySlot
        fields = ["session", "key", "content"]


class ScopeFilter(admin.SimpleListFilter):
    title = _("scope")
    parameter_name = "scope"

    def lookups(self, request, model_admin):
        return [("global", _("Global")), ("chat", _("A chat"))]

    def queryset(self, request, queryset):
        if self.value() == "global":
            return queryset.filter(session__isnull=True)
        if self.value() == "chat":
            return queryset.filter(session__isnull=False)
        return queryset


@admin.register(MemorySlot)
class MemorySlotAdmin(admin.ModelAdmin):
    form = MemorySlotForm
    list_display = ["key", "content", "scope", "updated_via", "updated_at"]
    list_filter = [ScopeFilter, "updated_via"]
    search_fields = ["key", "content", "session__session_id", "session__user_nickname"]
    raw_id_fields = ["session"]
    list_select_related = ["session"]

    @admin.display(description=_("scope"))
    def scope(self, obj: MemorySlot) -> str:
        return str(obj.session) if obj.session_id else gettext("Global")

    def get_readonly_fields(self, request, obj=None):
        return ["session", "key"] if obj is not None else []

    def save_model(self, request, obj: MemorySlot, form, change: bool) -> None:
        try:
            slot, _ = memory_slot_set(key=obj.key, content=obj.content, session=obj.session, via="operator")
        except LifeError as exc:
            self.message_user(request, gettext("Not saved: %(error)s") % {"error": exc.message}, messages.ERROR)
            return
        obj.pk = slot.pk
        obj._state.adding = False

    def delete_model(self, request, obj: MemorySlot) -> None:
        memory_slot_forget(key=obj.key, session=obj.session)

    def delete_queryset(self, request, queryset) -> None:
        for slot in queryset:
            memory_slot_forget(key=slot.key, session=slot.session)


@admin.register(SessionSummary)
class SessionSummaryAdmin(admin.ModelAdmin):
    list_display = ["session", "refreshed_at", "last_message_id", "error"]
    readonly_fields = ["session", "text", "last_message_id", "refreshed_at", "refresh_requested_at", "error"]
    search_fields = ["session__session_id", "text"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# --- life-loop turns (read-only) ------------------------------------------------------------------


class ToolCallInline(ReadOnlyInline):
    model = ToolCallRecord
    fk_name = "cycle"
    fields = ["tool_call_id", "name", "ok", "arguments", "raw_arguments", "result"]
    readonly_fields = fields


class LLMCallInline(ReadOnlyInline):
    model = LLMCall
    fk_name = "cycle"
    fields = ["purpose", "model", "prompt_tokens", "completion_tokens", "latency_ms", "cost", "error"]
    readonly_fields = fields


@admin.register(LifeTurn)
class LifeTurnAdmin(ReadOnlyAdmin):
    list_display = ["started_local", "action", "trigger", "session", "tool_call_count", "error"]
    list_filter = ["action"]
    search_fields = ["trigger", "error", "session__session_id"]
    inlines = [ToolCallInline, LLMCallInline]
    fields = ["cycle_id", "started_local", "ended_at", "session", "trigger", "action", "outcome", "reasoning",
              "error", "timings", "prompt_text"]  # fmt: skip
    readonly_fields = fields
    list_select_related = ["session"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind=CycleKind.LIFE).annotate(n_calls=Count("tool_calls"))

    @admin.display(description=_("started (bot time)"), ordering="started_at")
    def started_local(self, obj) -> str:
        return local(obj.started_at)

    @admin.display(description=_("tool calls"), ordering="n_calls")
    def tool_call_count(self, obj) -> int:
        return obj.n_calls

    @admin.display(description=_("prompt"))
    def prompt_text(self, obj) -> str:
        return format_html_join(
            "", "<p><b>{}</b></p><pre style='white-space:pre-wrap'>{}</pre>",
            ((m.get("role", ""), m.get("content", "")) for m in obj.prompt or []),
        )  # fmt: skip
