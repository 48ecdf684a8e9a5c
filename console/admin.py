"""The config's history in the admin: who changed which keys, and the model provider's old and new values;
the login (its form checks one password at a time per client and username: core.login_lock) and its
failed attempts (django-axes' page, its one action held to a permission)."""

from axes.admin import AccessAttemptAdmin
from axes.conf import settings as axes_settings
from axes.models import AccessAttempt
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from chat.admin import ReadOnlyAdmin
from chat.admin.conversations import ChatSessionAdmin
from chat.models import ChatSession
from console.permissions import label_permissions_of_users_and_groups
from console.site import unregister_task_queue_internals
from core.login_lock import SerializedLoginForm
from core.models import ConfigChange

admin.site.login_form = SerializedLoginForm
# The console's name, not Django's (the pages are a bot's console).
admin.site.site_header = _("maibot console")
admin.site.site_title = _("maibot")
admin.site.index_title = _("Administration")


@admin.register(ConfigChange)
class ConfigChangeAdmin(ReadOnlyAdmin):
    list_display = ["at", "user", "source", "keys", "provider"]
    list_filter = ["source"]
    date_hierarchy = "at"

    @admin.display(description=_("Changed keys"))
    def keys(self, obj: ConfigChange) -> str:
        return ", ".join(obj.changed_keys)


class LoginAttemptAdmin(AccessAttemptAdmin):
    """Axes' page of counted login failures (deleting a row lifts its lock): its clean-up action deletes
    rows, so it needs the delete permission like every action here (axes offers it to viewers)."""

    @admin.action(description=_("Clean up expired attempts"), permissions=["delete"])
    def cleanup_expired_attempts(self, request, queryset) -> None:
        super().cleanup_expired_attempts(request, queryset)

    @admin.display(description=_("Status"))
    def status(self, obj: AccessAttempt) -> str:
        left = axes_settings.AXES_FAILURE_LIMIT - obj.failures_since_start
        if left <= 0:
            return gettext("Locked out")
        return ngettext("%(count)d attempt left", "%(count)d attempts left", left) % {"count": left}


admin.site.unregister(AccessAttempt)
admin.site.register(AccessAttempt, LoginAttemptAdmin)


class ConsoleChatSessionAdmin(ChatSessionAdmin):
    """The sessions' admin with a link to each one's transcript page (console.transcript)."""

    list_display = [*ChatSessionAdmin.list_display, "transcript_link"]
    readonly_fields = ["transcript_link", *ChatSessionAdmin.readonly_fields]

    @admin.display(description=_("Transcript"))
    def transcript_link(self, obj: ChatSession) -> SafeString:
        url = reverse("console-transcript", args=[obj.pk])
        return format_html('<a class="transcript-link" href="{}">{}</a>', url, _("Open transcript"))


admin.site.unregister(ChatSession)
admin.site.register(ChatSession, ConsoleChatSessionAdmin)


unregister_task_queue_internals()
label_permissions_of_users_and_groups()
