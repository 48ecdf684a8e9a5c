"""The operator console's pages inside the admin (dashboard, config editor, raw TOML, live logs) and the
public /healthz endpoint. Views translate HTTP to the selectors in console.dashboard and the write path
in core.reload; they hold no logic of their own."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.core.exceptions import DisallowedHost, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from chat.agent import llm
from console import dashboard, problems
from console.config_editor import ConfigForm, file_notices, file_secrets, read_config_file, toml_with_values
from core import redaction, reload
from core.config import LLM_TASKS, ConfigError, config_path, get_config

VIEW_CONSOLE = "maibot.view_console"
CHANGE_CONFIG = "maibot.change_config"
CHANGE_LLM_PROVIDER = "maibot.change_llm_provider"
TEST_LLM_MODELS = "maibot.test_llm_models"
CHANGE_MCP_SERVERS = "maibot.change_mcp_servers"


def _require(request: HttpRequest, perm: str) -> None:
    # admin_view() already requires an active staff user; the console also needs its permission.
    if not request.user.has_perm(perm):
        raise PermissionDenied


def _context(request: HttpRequest, title: str, **extra) -> dict:
    return {**admin.site.each_context(request), "title": title, **extra}


# The dashboard refreshes itself this often (seconds); `?refresh=N` asks for another pace (within bounds).
REFRESH_SECONDS = 15
REFRESH_BOUNDS = (1, 3600)


def _refresh_seconds(request: HttpRequest) -> int:
    try:
        wanted = int(request.GET.get("refresh", REFRESH_SECONDS))
    except ValueError:
        wanted = REFRESH_SECONDS
    return min(max(wanted, REFRESH_BOUNDS[0]), REFRESH_BOUNDS[1])


def _dashboard_panels(request: HttpRequest) -> dict:
    """What the dashboard's panels show (the page and its refresh fragment render the same)."""
    now = timezone.now()
    lateness = dashboard.lateness_stats(now)
    usage = dashboard.llm_usage(now=now)
    deliveries = dashboard.delivery_counts()
    healthy = dashboard.health_checks(now)
    cfg = get_config()
    return {
        "problems": problems.problems(request.user, deliveries, healthy[1], now),
        "adapters": dashboard.connected_adapters(),
        "runtimes": dashboard.active_runtimes(),
        "chats": dashboard.recent_chats(),
        "scheduled": dashboard.scheduled_counts(),
        "deliveries": deliveries,
        "next_due": dashboard.next_due(),
        "timers": dashboard.timers_summary(),
        "lateness": lateness,
        "lateness_charts": dashboard.lateness_charts(lateness, now),
        "volume_charts": dashboard.volume_charts(dashboard.message_volume(now)),
        "usage": usage,
        "llm_charts": dashboard.llm_charts(usage),
        "spend": dashboard.llm_spend(now=now),
        "errors": dashboard.recent_errors(),
        "processes": dashboard.processes(),
        "healthy": healthy,
        "bot_tz": cfg.tzinfo,
        "updated_at": timezone.localtime(now, cfg.tzinfo),
    }


def dashboard_view(request: HttpRequest) -> HttpResponse:
    _require(request, VIEW_CONSOLE)
    return TemplateResponse(
        request,
        "admin/maibot/dashboard.html",
        _context(request, _("Dashboard"), refresh_seconds=_refresh_seconds(request), **_dashboard_panels(request)),
    )


@never_cache
@require_GET
def dashboard_panels_view(request: HttpRequest) -> HttpResponse:
    """The dashboard's panels alone, for the page's own refresh: the dashboard's permission, no frame."""
    _require(request, VIEW_CONSOLE)
    return TemplateResponse(request, "admin/maibot/dashboard_panels.html", _dashboard_panels(request))


def config_form_view(request: HttpRequest) -> HttpResponse:
    _require(request, CHANGE_CONFIG)
    text, file_cfg, file_error = read_config_file()
    secrets = file_secrets(text)
    if request.method == "POST":
        form = ConfigForm(request.POST, base=file_cfg or get_config(), secrets=secrets)
        if form.is_valid():
            new_text = toml_with_values(text, form.config)
            try:
                # Only the operator's changes were merged into `text`: refuse if the file moved on
                # again in between (the next save merges onto the newer file).
                result = reload.config_save_text(
                    text=new_text, expected_digest=reload.text_digest(text), **_acting(request)
                )
            except ConfigError as exc:  # the file changed meanwhile, or is broken beyond the form
                form.add_error(None, secrets.redact_text(str(exc)))
            else:
                _report_saved(request, result)
                return redirect("console-config")
    else:
        form = ConfigForm.from_config(file_cfg or get_config(), secrets)
    return TemplateResponse(
        request,
        "admin/maibot/config_form.html",
        _context(
            request,
            _("Bot configuration"),
            form=form,
            file_error=secrets.redact_text(file_error),
            notices=file_notices(text),
            path=config_path(),
        ),
    )


def config_raw_view(request: HttpRequest) -> HttpResponse:
    """The file's text with its secrets redacted; a save gives each placeholder left where it was its
    secret back (core.redaction)."""
    _require(request, CHANGE_CONFIG)
    text, _file_cfg, file_error = read_config_file()
    secrets = file_secrets(text)
    digest = reload.text_digest(text)
    shown = redaction.redact_toml(text, secrets)
    error = ""
    if request.method == "POST":
        shown = request.POST.get("toml", "").replace("\r\n", "\n")
        try:
            # The whole text replaces the file: refuse if the file changed since the page was loaded
            # (the operator's text stays in the box; saving again replaces the newer file knowingly).
            result = reload.config_save_text(
                text=redaction.restore_toml(shown, text, secrets),
                expected_digest=request.POST.get("base_digest", ""),
                **_acting(request),
            )
        except ConfigError as exc:
            error = secrets.redact_text(str(exc))
        else:
            _report_saved(request, result)
            return redirect("console-config-raw")
    return TemplateResponse(
        request,
        "admin/maibot/config_raw.html",
        _context(
            request,
            _("Bot configuration (TOML)"),
            toml=shown,
            base_digest=digest,
            error=error,
            file_error=secrets.redact_text(file_error),
            notices=file_notices(text),
            path=config_path(),
        ),
    )


def models_view(request: HttpRequest) -> HttpResponse:
    """The configured models and, on POST, the result of one tiny test call with a tool to each."""
    _require(request, TEST_LLM_MODELS)
    cfg = get_config()
    models = list(cfg.llm_models().values())
    results = []
    if request.method == "POST":
        wanted = request.POST.get("model", "")
        chosen = [m for m in models if not wanted or m.name == wanted]
        if wanted and not chosen:
            messages.error(request, _("There is no model named %(name)r.") % {"name": wanted})
        results = [llm.model_test(m) for m in chosen]
    routes = {task: [m.name for m in cfg.llm_route(task)] for task in LLM_TASKS}
    return TemplateResponse(
        request,
        "admin/maibot/models.html",
        _context(request, _("Models"), models=models, results=results, routes=routes),
    )


def _acting(request: HttpRequest) -> dict:
    """Who saves, whether they may point the model calls (and the API key) somewhere else, and whether
    they may change the MCP servers (programs started, URLs called)."""
    return {
        "user": request.user,
        "may_change_provider": request.user.has_perm(CHANGE_LLM_PROVIDER),
        "may_change_mcp": request.user.has_perm(CHANGE_MCP_SERVERS),
    }


def _report_saved(request: HttpRequest, result: reload.ReloadResult) -> None:
    if result.changed_keys:
        messages.success(request, _("Saved and applied: %(keys)s.") % {"keys": ", ".join(result.changed_keys)})
    else:
        messages.info(request, _("Saved; no setting changed."))
    for err in result.callback_errors:
        messages.warning(request, _("A reload callback failed: %(error)s") % {"error": err})


def logs_view(request: HttpRequest) -> HttpResponse:
    _require(request, VIEW_CONSOLE)
    return TemplateResponse(request, "admin/maibot/logs.html", _context(request, _("Live logs")))


def home(request: HttpRequest) -> HttpResponse:
    """`/` (the admin's "View site"): the dashboard for an operator who may see it, else the admin's index
    (which asks for a login first)."""
    if request.user.is_active and request.user.is_staff and request.user.has_perm(VIEW_CONSOLE):
        return redirect("console-dashboard")
    return redirect("admin:index")


def console_login(request: HttpRequest) -> HttpResponse:
    """The admin's login, landing on `/` (so on the dashboard) unless it was sent to a page of its own
    (`next`). The admin's index is no such page: it is where the printed "operator console" address
    (/admin/) sends a visitor to log in, and it lands on the dashboard too."""
    sent_to = request.POST.get(REDIRECT_FIELD_NAME, request.GET.get(REDIRECT_FIELD_NAME))
    if sent_to in (None, "", reverse("admin:index")):
        request.GET = request.GET.copy()
        request.GET[REDIRECT_FIELD_NAME] = reverse("home")
        if REDIRECT_FIELD_NAME in request.POST:
            request.POST = request.POST.copy()
            request.POST[REDIRECT_FIELD_NAME] = reverse("home")
    return admin.site.login(request)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """400: for a host this server does not answer to, what its operator can configure (core.hosts);
    otherwise Django's plain answer. Nothing here may ask the request for its host again."""
    if isinstance(exception, DisallowedHost):
        host = request.META.get("HTTP_HOST", "")
        body = format_html(
            "<!doctype html><title>{}</title><h1>{}</h1><p>{}</p>",
            _("Bad Request (400)"),
            _("This server does not answer to the name “%(host)s”.") % {"host": host},
            _(
                "If you run this server: add the name to ALLOWED_HOSTS (comma-separated) in the environment or "
                "in deployment.env in its data dir, and restart it. Names the set-up page was opened with are "
                "allowed already."
            ),
        )
        return HttpResponseBadRequest(body)
    return defaults.bad_request(request, exception)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    healthy, checks = dashboard.health_checks()
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", "time": timezone.now().isoformat(), "checks": checks},
        status=200 if healthy else 503,
    )
