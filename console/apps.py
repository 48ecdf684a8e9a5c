"""The operator console (dashboard, config editor, live logs, health): the top layer, it reads every app."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = _("Console")

    def ready(self) -> None:
        from console.third_party import name_axes_rows, name_third_party_apps

        name_third_party_apps()
        name_axes_rows()
