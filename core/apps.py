"""The bottom layer as an app: it owns the bot configuration's start-up check and the process models.

Its label stays "maibot" (the project package's historical app label), so its tables, migration
history, content types, permissions and /admin/maibot/ URLs are unchanged.
"""

import sys

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CoreConfig(AppConfig):
    name = "core"
    label = "maibot"
    verbose_name = _("Bot")

    def ready(self) -> None:
        from core.config import ConfigError, get_config

        # An invalid bot_config.toml stops start-up with one line naming the file, the key and the problem:
        # the operator's fix, not a trace of Django's start-up (which every command would print first).
        try:
            get_config()
        except ConfigError as exc:
            sys.stderr.write(f"Invalid bot configuration: {exc}\n")
            raise SystemExit(2) from None
