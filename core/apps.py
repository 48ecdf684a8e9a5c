"""The bottom layer as an app: it owns the bot configuration's start-up check and the process models.

Its label stays "maibot" (the project package's historical app label), so its tables, migration
history, content types, permissions and /admin/maibot/ URLs are unchanged.
"""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class CoreConfig(AppConfig):
    name = "core"
    label = "maibot"
    verbose_name = "Bot"

    def ready(self) -> None:
        from core.config import ConfigError, get_config

        # An invalid bot_config.toml stops start-up with a message naming the key and the problem.
        try:
            get_config()
        except ConfigError as exc:
            raise ImproperlyConfigured(f"Invalid bot configuration: {exc}") from None
