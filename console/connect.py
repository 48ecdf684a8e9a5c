"""The "Connect an adapter" page: for each way QQ reaches the bot (the NapCat adapter plugin, the standalone
adapter in legacy mode, the standalone adapter in API-Server mode) what to write in the adapter's
config.toml, with this server's real addresses; the adapters' live state (a small JSON endpoint the page
polls); and the deployment's secrets (adapter tokens, model keys): masked, revealed and changed only by a
POST of a user with MANAGE_SECRETS (core.deployment_secrets records each use).

Addresses: the ones this server is bound to (core.listen.open_urls: for a wildcard bind, this machine's
own addresses), and the one the browser used when its host is one this server answers to (ALLOWED_HOSTS
without the first run's wildcard; Django has validated it) with wss only when a trusted proxy said https
(maibot.proxies): a forged Host never reaches a snippet.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import split_domain_port, validate_host
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from chat.accounts import bot_account
from chat.models import AdapterConnection
from console.views import VIEW_CONSOLE, _context, _require
from core import deployment_secrets, hosts
from core.adapter_tokens import DEFAULT_PLATFORM
from core.config import get_config
from core.listen import WILDCARDS, open_urls
from plugins.host_base import plugins_dir

MANAGE_SECRETS = deployment_secrets.MANAGE_SECRETS
NAPCAT_PLUGIN_ID = "maibot-team.napcat-adapter"
MASK = "••••••••"


def ws_addresses(request: HttpRequest) -> list[str]:
    """The /ws addresses an adapter can dial: the browser's (when this server answers to its host), then
    the bound ones."""
    found = [url.replace("http://", "ws://", 1) for url in open_urls(settings.HOST, settings.PORT, "/ws")]
    host = request.get_host()
    domain, _port = split_domain_port(host)
    if domain and validate_host(domain, [h for h in settings.ALLOWED_HOSTS if h != hosts.ANY_HOST]):
        browser = f"{'wss' if request.is_secure() else 'ws'}://{host}/ws"
        found = [browser, *(url for url in found if url != browser)]
    return found


def _loopback_host() -> str:
    """The address the standalone adapter on this machine dials (a loopback bind or a wildcard: 127.0.0.1)."""
    if settings.HOST in WILDCARDS:
        return "127.0.0.1"
    try:
        return "127.0.0.1" if ipaddress.ip_address(settings.HOST.strip("[]")).is_loopback else settings.HOST
    except ValueError:
        return settings.HOST


def snippets(address: str) -> dict[str, str]:
    """Each way's config.toml text (the API-Server key masked: the page fills it in on "show")."""
    return {
        "plugin": (
            '[plugin]\nenabled = true\nconfig_version = "0.1.0"\n\n'
            '[napcat_server]\nhost = "127.0.0.1"\nport = 3001\ntoken = ""\n\n'
            "[chat]\nenable_chat_list_filter = false\n"
        ),
        "legacy": f'[maibot_server]\nenable_api_server = false\nhost = "{_loopback_host()}"\nport = {settings.PORT}\n',
        "apiserver_head": f'[maibot_server]\nenable_api_server = true\nbase_url = "{address}"\napi_key = "',
    }


def adapter_state() -> list[dict]:
    """Per platform seen: connected (since, protocol, bot account) or when it was last seen. Never a secret."""
    rows = list(AdapterConnection.objects.order_by("platform", "-connected_at")[:500])
    state: dict[str, dict] = {}
    for row in rows:
        entry = state.setdefault(row.platform, {"platform": row.platform, "connected": False, "last_seen": None})
        if row.disconnected_at is None and not entry["connected"]:
            entry.update(connected=True, since=row.connected_at, protocol=row.protocol)
        elif row.disconnected_at and (entry["last_seen"] is None or row.disconnected_at > entry["last_seen"]):
            entry["last_seen"] = row.disconnected_at
    for entry in state.values():
        entry["account"] = bot_account(entry["platform"]) or ""
    return sorted(state.values(), key=lambda e: (not e["connected"], e["platform"]))


def _iso(value) -> str | None:
    return timezone.localtime(value, get_config().tzinfo).isoformat() if value else None


@never_cache
def connect_view(request: HttpRequest) -> HttpResponse:
    _require(request, VIEW_CONSOLE)
    addresses = ws_addresses(request)
    listing = deployment_secrets.listing()
    qq_token = next(s for s in listing if s.kind == "adapter" and s.name == DEFAULT_PLATFORM)
    return TemplateResponse(
        request,
        "admin/maibot/connect.html",
        _context(
            request,
            _("Connect an adapter"),
            addresses=addresses,
            snippet=snippets(addresses[0] if addresses else "ws://127.0.0.1/ws"),
            mask=MASK,
            qq_token=qq_token,
            secrets=listing,
            may_manage=request.user.has_perm(MANAGE_SECRETS),
            adapters=adapter_state(),
            plugin_folder=plugins_dir() / "napcat_adapter",
            plugin_id=NAPCAT_PLUGIN_ID,
            port=settings.PORT,
            state_url=reverse("console-connect-state"),
            secret_url=reverse("console-secret"),
            bot_tz=get_config().tzinfo,
        ),
    )


@never_cache
@require_GET
def connect_state_view(request: HttpRequest) -> JsonResponse:
    """The adapters' live state for the page's poll (times ISO 8601 in the bot's zone, with the offset)."""
    _require(request, VIEW_CONSOLE)
    adapters = [
        {**entry, "since": _iso(entry.get("since")), "last_seen": _iso(entry["last_seen"])} for entry in adapter_state()
    ]
    return JsonResponse({"adapters": adapters, "time": _iso(timezone.now())})


@never_cache
@require_POST
def secret_view(request: HttpRequest) -> JsonResponse:
    """POST action=reveal|rotate|remove|set, secret=<id>[, value]: JSON. 403 without MANAGE_SECRETS."""
    if not request.user.has_perm(MANAGE_SECRETS):
        raise PermissionDenied
    action, secret_id = request.POST.get("action", ""), request.POST.get("secret", "")
    kind, _colon, name = secret_id.partition(":")
    try:
        if action == "reveal":
            return JsonResponse({"ok": True, "value": deployment_secrets.reveal(secret_id, user=request.user)})
        if action == "rotate" and kind == "adapter":
            value = deployment_secrets.rotate_adapter_token(name, user=request.user)
            return JsonResponse({"ok": True, "value": value, "message": _("A new token is in force.")})
        if action == "remove" and kind == "adapter":
            deployment_secrets.remove_adapter_token(name, user=request.user)
            return JsonResponse({"ok": True, "message": _("The token is removed.")})
        if action == "set" and kind == "model":
            deployment_secrets.set_model_key(name, request.POST.get("value", ""), user=request.user)
            return JsonResponse({"ok": True, "message": _("The new key is in force from the next model call.")})
    except deployment_secrets.SecretError as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=400)
    return JsonResponse({"ok": False, "error": _("Unknown action.")}, status=400)
