"""The admin's shared pieces: status badges and the read-only admin and inline (records, not documents:
operators read them; services write them)."""

import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from chat.fate import (
    FATE_COLOURS,
    NEEDS_ATTENTION,
    Fate,
)


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


ERROR_COLOUR = "#c62828"


def error_badge(error: str) -> SafeString | str:
    """A record's error column: a red "error" pill with the error on hover, or "-" when there was none
    (never the admin's boolean icons, whose green tick reads as "fine")."""
    if not error:
        return "-"
    return badge(ERROR_COLOUR, gettext("error"), error[:500])


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records, not documents: operators read them; services write them."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


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


def json_block(value) -> SafeString:
    """`value` as indented JSON in a <pre>."""
    return format_html(
        '<pre style="white-space:pre-wrap;margin:0">{}</pre>', json.dumps(value, ensure_ascii=False, indent=1)
    )
