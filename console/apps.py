"""The operator console (dashboard, config editor, live logs, health): the top layer, it reads every app."""

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"
