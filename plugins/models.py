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


class PluginDataRow(models.Model):
    """One row a plugin stored through the database.* capabilities: the plugin's own, in a collection
    it names (`model_name`, MaiBot's table name); `row_id` is the row's `id` as the plugin sees it,
    unique within (plugin, collection). A plugin reaches only rows whose `plugin_id` is its own; `size`
    is the row's JSON size in bytes, which its quota counts (plugins.capabilities.database)."""

    plugin_id = models.CharField(max_length=128)
    model_name = models.CharField(max_length=64)
    row_id = models.PositiveBigIntegerField()
    data = models.JSONField(default=dict)
    size = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["plugin_id", "model_name", "row_id"], name="plugin_data_row_unique_id")
        ]

    def __str__(self) -> str:
        return f"{self.plugin_id}:{self.model_name}#{self.row_id}"
