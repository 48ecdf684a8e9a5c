"""The knowledge store in the admin: the entries plugins' knowledge.search finds (chat.knowledge). The
operator adds, edits, disables and deletes them (staff with the model's permissions)."""

from django.contrib import admin

from chat.models import KnowledgeEntry


@admin.register(KnowledgeEntry)
class KnowledgeEntryAdmin(admin.ModelAdmin):
    list_display = ("title", "enabled", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("title", "content")
    fields = ("title", "content", "enabled")
    ordering = ("-updated_at",)
