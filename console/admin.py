"""The config's history in the admin: who changed which keys, and the model provider's old and new values."""

from django.contrib import admin

from chat.admin import ReadOnlyAdmin
from maibot.models import ConfigChange


@admin.register(ConfigChange)
class ConfigChangeAdmin(ReadOnlyAdmin):
    list_display = ["at", "user", "source", "keys", "provider"]
    list_filter = ["source"]
    date_hierarchy = "at"

    @admin.display(description="Changed keys")
    def keys(self, obj: ConfigChange) -> str:
        return ", ".join(obj.changed_keys)
