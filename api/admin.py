"""Operator admin for proactive API tokens (create, the token shown once; revoke; see last use) and the calls
made with them to the bot's MCP endpoint (/mcp)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from api.access import api_token_create, api_token_revoke
from api.models import McpEndpointCall
from chat.admin import ReadOnlyAdmin
from chat.models import ApiScope, ApiToken, default_api_scopes


class ListField(forms.CharField):
    """A list typed as comma-separated words."""

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        return [v.strip() for v in (value or "").split(",") if v.strip()]


class ApiTokenForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiScope.choices,
        label=_("Scopes"),
        widget=forms.CheckboxSelectMultiple,
        initial=default_api_scopes,
        help_text=_("New tokens: send, and read and cancel their own messages only."),
    )
    allowed_channels = ListField(
        required=False,
        label=_("Allowed channels"),
        help_text=_(
            "Platforms it may send to, comma-separated (e.g. qq). Empty: every platform but the operators' "
            "browser chat (web), which a token reaches only when it names it here."
        ),
    )
    allowed_conversations = ListField(
        required=False,
        label=_("Allowed conversations"),
        help_text=_("Conversation ids it may send to, comma-separated. Empty: any conversation."),
    )

    class Meta:
        model = ApiToken
        fields = ["name", "scopes", "allowed_channels", "allowed_conversations"]
        help_texts = {
            "name": _("Who uses this token (e.g. the monitoring system). The token is shown once after saving.")
        }


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "state",
        "scopes",
        "created_at",
        "created_by",
        "last_used_at",
        "revoked_at",
        "mcp_calls",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_by", "created_at", "last_used_at", "revoked_at", "mcp_calls"]
    actions = ["revoke"]

    form = ApiTokenForm
    EDITABLE = ["name", "scopes", "allowed_channels", "allowed_conversations"]

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        if obj is None:
            return self.EDITABLE
        return [*self.EDITABLE, *self.readonly_fields]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> list[str]:
        return [] if obj is None else self.readonly_fields

    @admin.display(description=_("MCP calls"))
    def mcp_calls(self, obj: ApiToken):
        # The token's recent calls to the bot's MCP endpoint (/mcp), in their own list.
        url = reverse("admin:api_mcpendpointcall_changelist") + f"?token__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, gettext("recent calls"))

    @admin.display(description=_("State"))
    def state(self, obj: ApiToken) -> str:
        return gettext("active") if obj.is_active else gettext("revoked")

    def save_model(self, request: HttpRequest, obj: ApiToken, form, change: bool) -> None:
        if change:
            obj.save(update_fields=self.EDITABLE)
            return
        # The raw token exists only in this request: kept on the request for response_add to show.
        token, raw = api_token_create(
            name=obj.name,
            created_by=request.user,
            scopes=obj.scopes,
            allowed_channels=obj.allowed_channels,
            allowed_conversations=obj.allowed_conversations,
        )
        for name in ("id", "prefix", "token_hash", "created_by", "created_at", "scopes"):
            setattr(obj, name, getattr(token, name))
        obj._state.adding = False
        request._created_api_token = raw

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue=None) -> HttpResponse:
        raw = getattr(request, "_created_api_token", None)
        if raw is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("API token %(name)s created") % {"name": obj.name},
            "opts": self.opts,
            "token": obj,
            "raw_token": raw,
        }
        response = TemplateResponse(request, "admin/chat/apitoken/created.html", context)
        # The secret must not linger in any cache.
        response["Cache-Control"] = "no-store"
        return response

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("chat.revoke_apitoken")

    @admin.action(description=_("Revoke selected tokens"), permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = [t.name for t in queryset if api_token_revoke(token=t)]
        if revoked:
            self.message_user(
                request, gettext("Revoked: %(names)s. Requests with them now get 401.") % {"names": ", ".join(revoked)}
            )
        else:
            self.message_user(request, gettext("The selected tokens were already revoked."), level=messages.WARNING)


@admin.register(McpEndpointCall)
class McpEndpointCallAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "token_link", "tool", "ok", "error_code", "duration"]
    list_filter = ["ok", "tool", "error_code", "token"]
    list_select_related = ["token"]
    date_hierarchy = "created_at"

    @admin.display(description=_("Token"), ordering="token__name")
    def token_link(self, obj: McpEndpointCall):
        if obj.token is None:
            return "—"
        url = reverse("admin:chat_apitoken_change", args=[obj.token_id])
        return format_html('<a href="{}">{}</a>', url, obj.token)

    @admin.display(description=_("Duration"), ordering="duration_ms")
    def duration(self, obj: McpEndpointCall) -> str:
        return f"{obj.duration_ms:.0f} ms"
