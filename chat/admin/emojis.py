"""The emoji library in the admin: every emoji the bot has (received, sent or registered by a plugin),
with the description and emotion the planner's send_emoji and the plugins' emoji.* pick by. The
operator describes emojis here (plugins register them without a description) and may delete them."""

import base64

from django.contrib import admin
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from chat.models import Emoji

PREVIEW_MAX_BYTES = 128 * 1024  # larger emojis show their size instead (a list page stays light)


@admin.register(Emoji)
class EmojiAdmin(admin.ModelAdmin):
    list_display = ("preview", "description", "emotion", "usage_count", "origin", "created_at")
    list_editable = ("description", "emotion")
    list_filter = ("registered_by",)
    search_fields = ("description", "emotion", "sha256")
    fields = ("preview", "description", "emotion", "sha256", "mime", "size", "usage_count", "origin", "created_at")
    readonly_fields = ("preview", "sha256", "mime", "size", "usage_count", "origin", "created_at")
    ordering = ("-usage_count", "-created_at")
    list_per_page = 24

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind="emoji")

    def has_add_permission(self, request) -> bool:
        return False  # emojis come from chats and plugins; the library only describes them

    @admin.display(description=_("emoji"))
    def preview(self, obj: Emoji):
        if obj.size > PREVIEW_MAX_BYTES or not obj.mime.startswith("image/"):
            return f"{obj.mime or '?'}, {obj.size // 1024} KB"
        try:
            with obj.file.open("rb") as fh:
                data = base64.b64encode(fh.read()).decode()
        except OSError as exc:
            return gettext("file missing: %(error)s") % {"error": exc}
        style = "max-height:64px;max-width:96px"
        return format_html('<img src="data:{};base64,{}" style="{}" alt="">', obj.mime, data, style)

    @admin.display(description=_("from"), ordering="registered_by")
    def origin(self, obj: Emoji) -> str:
        if obj.registered_by:
            return gettext("plugin %(plugin)s") % {"plugin": obj.registered_by}
        return gettext("chats")
