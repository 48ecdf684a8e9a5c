"""The operator console (dashboard, config editor, live logs, health): the top layer, it reads every app."""

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.utils.translation import gettext_lazy as _


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = _("Console")

    def ready(self) -> None:
        from console.third_party import name_axes_rows, name_third_party_apps

        name_third_party_apps()
        name_axes_rows()


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """Django's admin app, serving the console's site (console.site.ConsoleSite); INSTALLED_APPS names it
    in place of django.contrib.admin ("console" itself stays ConsoleConfig)."""

    default = False

    default_site = "console.site.ConsoleSite"
