"""The project package as an app: it owns the bot configuration's start-up check and commands."""

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured


class MaibotConfig(AppConfig):
    name = "maibot"
    verbose_name = "Bot"

    def ready(self) -> None:
        from maibot.config import ConfigError, get_config

        # An invalid bot_config.toml stops start-up with a message naming the key and the problem.
        try:
            get_config()
        except ConfigError as exc:
            raise ImproperlyConfigured(f"Invalid bot configuration: {exc}") from None
