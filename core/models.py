"""The operator console's own tables: log lines for the live log page and process heartbeats."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import gettext_noop


class LogEntry(models.Model):
    """One log record (INFO and above) from the ASGI server or the cluster, kept for the live log page."""

    created_at = models.DateTimeField(db_index=True)
    level = models.PositiveSmallIntegerField()  # logging's numeric level: 20 INFO, 30 WARNING, 40 ERROR
    level_name = models.CharField(max_length=16)
    logger = models.CharField(max_length=255)
    module = models.CharField(max_length=255, blank=True)
    line = models.PositiveIntegerField(default=0)
    message = models.TextField()
    process = models.CharField(max_length=16, blank=True)  # web | cluster
    pid = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("log line")
        verbose_name_plural = _("log lines")
        ordering = ["id"]
        indexes = [models.Index(fields=["level", "id"], name="logentry_level_idx")]
        verbose_name_plural = "log entries"

    def __str__(self) -> str:
        return f"{self.level_name} {self.logger}: {self.message[:60]}"


class ProcessHeartbeat(models.Model):
    """The last sign of life of one server or cluster process (core.process.Heartbeat writes it).

    /healthz reads the cluster's. Claims of work (outbound messages, scheduled messages) name their
    claimer's `instance`: once `alive_until` has passed, the process counts as dead and the other
    processes take its claims back. Both times are the database's clock, so clocks of different
    machines never enter the comparison.
    """

    class Role(models.TextChoices):
        WEB = "web", _("ASGI server")
        CLUSTER = "cluster", _("Task cluster")

    # The process's identity in claims: new in every process, never reused (host:pid is, e.g. by a
    # restarted container). NULL (and alive_until NULL) only in a row an older version still running
    # writes during a rolling upgrade: such a process makes no claim this rule could take back.
    instance = models.CharField(max_length=32, unique=True, null=True)
    name = models.CharField(max_length=128)  # host:pid, for people
    role = models.CharField(max_length=16, choices=Role.choices)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    # The last beat plus the silence after which the process counts as dead (each row carries its
    # writer's own interval, so processes with different settings judge each other right).
    alive_until = models.DateTimeField(null=True, db_index=True)

    class Meta:
        verbose_name = _("process heartbeat")
        verbose_name_plural = _("process heartbeats")
        ordering = ["-beat_at"]

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


class Console(models.Model):
    """No table: only the operator console's permissions (superusers have them all)."""

    class Meta:
        verbose_name = _("console")
        verbose_name_plural = _("console")
        managed = False
        default_permissions = ()
        permissions = [
            ("view_console", gettext_noop("Can view the dashboard and the live logs")),
            ("change_config", gettext_noop("Can edit the bot configuration")),
            ("change_llm_provider", gettext_noop("Can change the model provider (llm.base_url, llm.api_key_env)")),
            ("test_llm_models", gettext_noop("Can test the configured models (each test is a paid call)")),
            (
                "change_mcp_servers",
                gettext_noop(
                    "Can change the MCP servers (mcp.servers: the programs the bot starts, "
                    "the URLs and headers it uses)"
                ),
            ),
            (
                "manage_secrets",
                gettext_noop("Can see and change the adapter tokens and the model API keys (each use is recorded)"),
            ),
        ]


class ConfigChange(models.Model):
    """One applied change of the bot configuration made through the console: who, when, which keys."""

    at = models.DateTimeField(auto_now_add=True, db_index=True, verbose_name=_("at"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("user")
    )
    source = models.CharField(max_length=64, verbose_name=_("source"))
    changed_keys = models.JSONField(default=list, verbose_name=_("changed keys"))
    # Old and new values of the model-provider keys when they changed (never secrets: names and URLs).
    provider = models.JSONField(default=dict, blank=True, verbose_name=_("provider"))

    class Meta:
        verbose_name = _("config change")
        verbose_name_plural = _("config changes")
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {', '.join(self.changed_keys)}"
