"""The permissions of the operator actions on plugins (superusers have them all), the record of plugins
installed from the console, and the rows plugins store."""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop


class PluginAdmin(models.Model):
    """No table: the permissions only (named in the operator's language by console.permissions)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("enable_plugin", gettext_noop("Can enable a plugin")),
            ("disable_plugin", gettext_noop("Can disable a plugin")),
            ("reload_plugin", gettext_noop("Can reload a plugin (its code and config.toml)")),
            (
                "install_plugin_dependencies",
                gettext_noop("Can install a plugin's Python dependencies (pip into the bot's environment)"),
            ),
            ("change_plugin_config", gettext_noop("Can edit a plugin's config.toml")),
            # Installing code is not config: change_config does not grant it.
            ("install_plugin", gettext_noop("Can install a plugin (a zip upload or a git URL: code the bot runs)")),
        ]


class PluginInstall(models.Model):
    """One attempt to install or update a plugin from the console: who, when, from where, and what came of
    it (an attempt refused, e.g. a bad manifest or a path outside the plugin's folder, is kept with its
    reason). An update (`update`) also keeps the version it replaced (`previous_version`)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True, verbose_name=_("at"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("user")
    )
    source = models.CharField(max_length=8, verbose_name=_("source"))  # "zip" or "git"
    origin = models.CharField(max_length=500, verbose_name=_("origin"))  # the file's name or the git URL
    revision = models.CharField(max_length=80, blank=True, verbose_name=_("revision"))  # sha256 or commit
    plugin_id = models.CharField(max_length=200, blank=True, verbose_name=_("plugin id"))
    version = models.CharField(max_length=40, blank=True, verbose_name=_("version"))
    folder = models.CharField(max_length=200, blank=True, verbose_name=_("folder"))
    ok = models.BooleanField(default=False, verbose_name=_("installed"))
    update = models.BooleanField(default=False, verbose_name=_("update"))
    previous_version = models.CharField(max_length=40, blank=True, verbose_name=_("previous version"))
    detail = models.TextField(blank=True, verbose_name=_("detail"))

    class Meta:
        verbose_name = _("plugin installation")
        verbose_name_plural = _("plugin installations")
        ordering = ["-at"]
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.plugin_id or self.origin}"


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
        verbose_name = _("plugin data row")
        verbose_name_plural = _("plugin data rows")
        constraints = [
            models.UniqueConstraint(fields=["plugin_id", "model_name", "row_id"], name="plugin_data_row_unique_id")
        ]

    def __str__(self) -> str:
        return f"{self.plugin_id}:{self.model_name}#{self.row_id}"
