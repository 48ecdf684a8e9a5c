"""Conversations in the admin: sessions and their messages read-only and in order, with each outbound
message's delivery (badge, filter, and a resend action for unconfirmed or failed ones), and what is known
of each platform's adapter."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import format_lazy
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from chat.admin.base import ReadOnlyAdmin, fate_badge
from chat.admin.cycles import cycles_url
from chat.fate import (
    NEEDS_ATTENTION,
    RECENT_DELIVERY_HOURS,
    RESENDABLE,
    Fate,
    message_fate,
    outbound_fate_counts,
    recent_delivery_since,
)
from chat.models import AdapterPlatform, ChatSession, DeliveryStatus, Message
from chat.services import messages_resend
from core.config import format_shown, get_config

CONVERSATION_TAIL = 200


@admin.register(ChatSession)
class ChatSessionAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "platform", "chat_type", "target", "last_active_local", "messages_link", "cycles"]
    list_filter = ["platform", "chat_type"]
    search_fields = ["session_id", "user_id", "user_nickname", "group_id", "group_name"]
    readonly_fields = [
        "session_id", "platform", "chat_type", "user_id", "user_nickname", "user_cardname", "group_id",
        "group_name", "created_at", "last_active_at", "cycles", "conversation",
    ]  # fmt: skip

    @admin.display(description=_("user / group id"))
    def target(self, obj: ChatSession) -> str:
        return obj.target_id

    @admin.display(description=_("last active"), ordering="last_active_at")
    def last_active_local(self, obj: ChatSession) -> str:
        return format_shown(obj.last_active_at, get_config().tzinfo)

    @admin.display(description=_("messages"))
    def messages_link(self, obj: ChatSession) -> str:
        url = reverse("admin:chat_message_changelist") + f"?session__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, _("messages"))

    @admin.display(description=_("planner cycles"))
    def cycles(self, obj: ChatSession) -> SafeString:
        count = obj.cycles.count()
        label = ngettext("%(count)d cycle", "%(count)d cycles", count) % {"count": count}
        return format_html('<a href="{}">{}</a>', cycles_url(obj.pk), label)

    @admin.display(
        description=format_lazy(_("conversation (last {count} messages, oldest first)"), count=CONVERSATION_TAIL)
    )
    def conversation(self, obj: ChatSession) -> str:
        tz = get_config().tzinfo
        tail = list(obj.messages.order_by("-time", "-id")[:CONVERSATION_TAIL])[::-1]
        if not tail:
            return gettext("No messages yet.")
        nickname = get_config().bot.nickname
        rows = format_html_join(
            "",
            '<div class="mb-msg mb-{}"><span class="mb-time">{}</span> <strong>{}</strong>'
            ' <span class="mb-kind">{}</span><div class="mb-text">{}</div></div>',
            (
                (
                    m.direction,
                    format_shown(m.time, tz),
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

    title = _("delivery")
    parameter_name = "delivery"
    ATTENTION = "attention"

    def lookups(self, request, model_admin):
        return [
            (self.ATTENTION, _("Needs attention (unconfirmed or failed)")),
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

    @admin.display(description=_("delivery"), ordering="delivery_status")
    def delivery(self, obj: Message) -> SafeString | str:
        fate = message_fate(obj)
        if fate is None:
            return "-"
        return fate_badge(fate, reason=obj.delivery_error)

    def has_resend_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.resend_message")

    @admin.action(description=_("Resend selected (unconfirmed or failed outbound only)"), permissions=["resend"])
    def resend_selected(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        resent = messages_resend(message_ids=ids, by=f"operator:{request.user.get_username()}")
        if resent:
            done = gettext("Put %(count)d message(s) back in the outbox.") % {"count": len(resent)}
            self.message_user(request, done, messages.SUCCESS)
        if skipped := len(ids) - len(resent):
            states = gettext(" or ").join(str(Fate(s).label).lower() for s in RESENDABLE)
            text = gettext("Skipped %(count)d: only outbound messages that are %(states)s can be resent.")
            self.message_user(request, text % {"count": skipped, "states": states}, messages.WARNING)

    @admin.display(description=_("time"), ordering="time")
    def time_local(self, obj: Message) -> str:
        return format_shown(obj.time, get_config().tzinfo)

    @admin.display(description=_("from"))
    def who(self, obj: Message) -> str:
        return get_config().bot.nickname if obj.direction == "out" else (obj.sender_nickname or obj.sender_id)

    @admin.display(description=_("text"))
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

    fields = [
        "platform", "echoes", "first_echo_at", "last_echo_at", "no_echo_at", "accept_format", "bot_account",
        "updated_at",
    ]  # fmt: skip
    readonly_fields = fields

    @admin.display(boolean=True, description=_("echoes deliveries"))
    def echoes(self, obj: AdapterPlatform) -> bool | None:
        """Yes, no (shown never to echo: chat.delivery_gate), or unknown yet (unproven)."""
        return True if obj.echoes else (False if obj.never_echoes else None)

    @admin.display(description=_("last echo"), ordering="last_echo_at")
    def last_echo_local(self, obj: AdapterPlatform) -> str:
        return format_shown(obj.last_echo_at, get_config().tzinfo) if obj.last_echo_at else "-"

    def get_list_display(self, request: HttpRequest):
        # The counts of every platform on the page come from one grouped query per request.
        counts = outbound_fate_counts(since=recent_delivery_since())
        return [
            "platform",
            "echoes",
            "last_echo_local",
            "accept_format",
            "bot_account",
            _platform_count(
                counts,
                "recent",
                DeliveryStatus.DELIVERED,
                format_lazy(_("delivered ({hours} h)"), hours=RECENT_DELIVERY_HOURS),
            ),
            _platform_count(counts, "open", DeliveryStatus.UNCONFIRMED, _("unconfirmed")),
            _platform_count(counts, "open", DeliveryStatus.FAILED, _("failed")),
        ]
