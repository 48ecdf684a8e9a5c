"""Operator console for conversations: sessions, and their messages read-only and in order."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from chat.models import ChatSession, Message
from maibot.config import get_config
from scheduling.timespec import format_instant

CONVERSATION_TAIL = 200


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
    list_display = ["__str__", "platform", "chat_type", "target", "last_active_local", "messages_link"]
    list_filter = ["platform", "chat_type"]
    search_fields = ["session_id", "user_id", "user_nickname", "group_id", "group_name"]
    readonly_fields = [
        "session_id", "platform", "chat_type", "user_id", "user_nickname", "user_cardname", "group_id",
        "group_name", "created_at", "last_active_at", "conversation",
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


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["time_local", "session", "direction", "source_kind", "who", "short_text", "delivery_status"]
    list_filter = ["direction", "source_kind", "delivery_status", "session__platform"]
    search_fields = ["text", "platform_message_id", "sender_id", "sender_nickname", "session__session_id"]
    list_select_related = ["session"]
    ordering = ["-time", "-id"]
    date_hierarchy = "time"

    @admin.display(description="time", ordering="time")
    def time_local(self, obj: Message) -> str:
        return format_instant(obj.time, get_config().tzinfo)

    @admin.display(description="from")
    def who(self, obj: Message) -> str:
        return get_config().bot.nickname if obj.direction == "out" else (obj.sender_nickname or obj.sender_id)

    @admin.display(description="text")
    def short_text(self, obj: Message) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"


# The proactive API's tokens keep their admin in their own module.
from chat import admin_api  # noqa: E402, F401
