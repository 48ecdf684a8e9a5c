"""HTTP routes: the admin (operator console), the API, the chat page, /healthz."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from api.http import api as proactive_api
from chat.views import chat_page
from console import connect, setup, transcript, views
from plugins.install_views import plugin_install_view, plugin_rescan_view, plugin_update_view
from plugins.views import plugin_action_view, plugin_config_view, plugins_view

urlpatterns = [
    path("", views.home, name="home"),
    # The admin's login, landing on the dashboard (its own route below is never reached).
    path("admin/login/", views.console_login, name="console-login"),
    # The console's own admin pages: admin_view() gives them the admin's login, staff check and CSRF.
    path("admin/console/", admin.site.admin_view(views.dashboard_view), name="console-dashboard"),
    path(
        "admin/console/panels/",
        admin.site.admin_view(views.dashboard_panels_view),
        name="console-dashboard-panels",
    ),
    path("admin/config/", admin.site.admin_view(views.config_form_view), name="console-config"),
    path("admin/config/raw/", admin.site.admin_view(views.config_raw_view), name="console-config-raw"),
    path("admin/logs/", admin.site.admin_view(views.logs_view), name="console-logs"),
    path("admin/models/", admin.site.admin_view(views.models_view), name="console-models"),
    path("admin/connect/", admin.site.admin_view(connect.connect_view), name="console-connect"),
    path("admin/connect/state/", admin.site.admin_view(connect.connect_state_view), name="console-connect-state"),
    path("admin/connect/secret/", admin.site.admin_view(connect.secret_view), name="console-secret"),
    path("admin/plugins/", admin.site.admin_view(plugins_view), name="console-plugins"),
    # Their paths are also plugins.upload_limit's (the ASGI server refuses a bigger body before reading it).
    path("admin/plugins/install/", admin.site.admin_view(plugin_install_view), name="console-plugin-install"),
    path("admin/plugins/update/", admin.site.admin_view(plugin_update_view), name="console-plugin-update"),
    path("admin/plugins/rescan/", admin.site.admin_view(plugin_rescan_view), name="console-plugin-rescan"),
    path(
        "admin/chats/<int:session_pk>/",
        admin.site.admin_view(transcript.transcript_view),
        name="console-transcript",
    ),
    path(
        "admin/chats/<int:session_pk>/send/",
        admin.site.admin_view(transcript.transcript_send_view),
        name="console-transcript-send",
    ),
    path(
        "admin/plugins/<str:plugin_id>/config/",
        admin.site.admin_view(plugin_config_view),
        name="console-plugin-config",
    ),
    path(
        "admin/plugins/<str:plugin_id>/<str:action>/",
        admin.site.admin_view(plugin_action_view),
        name="console-plugin-action",
    ),
    path("admin/", admin.site.urls),
    path("api/v1/", proactive_api.urls),
    path("chat/", chat_page, name="chat"),
    path("healthz", views.healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name no icon (the API docs): the console's icon, no 404.
    path("favicon.ico", RedirectView.as_view(url=static("maibot/favicon.svg"), permanent=True)),
    path("setup/", setup.setup_view, name="setup"),
    path("setup/test-model/", setup.test_model_view, name="setup-test-model"),
    # The language switch (Django's set_language: a cookie, then back to the page).
    path("i18n/", include("django.conf.urls.i18n")),
]

# A host this server does not answer to: a 400 saying what to configure (core.hosts).
handler400 = views.bad_request
