"""No tables: only the permissions of the operator actions on plugins (superusers have them all)."""

from django.db import models


class PluginAdmin(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("enable_plugin", "Can enable a plugin"),
            ("disable_plugin", "Can disable a plugin"),
            ("reload_plugin", "Can reload a plugin (its code and config.toml)"),
            (
                "install_plugin_dependencies",
                "Can install a plugin's Python dependencies (pip into the bot's environment)",
            ),
            ("change_plugin_config", "Can edit a plugin's config.toml"),
        ]
