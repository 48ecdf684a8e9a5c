"""The operator console's own tables: log lines for the live log page and process heartbeats."""

from __future__ import annotations

from django.db import models


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
        ordering = ["id"]
        indexes = [models.Index(fields=["level", "id"], name="logentry_level_idx")]
        verbose_name_plural = "log entries"

    def __str__(self) -> str:
        return f"{self.level_name} {self.logger}: {self.message[:60]}"


class ProcessHeartbeat(models.Model):
    """The last sign of life of one server or cluster process; /healthz reads the cluster's."""

    class Role(models.TextChoices):
        WEB = "web", "ASGI server"
        CLUSTER = "cluster", "Task cluster"

    name = models.CharField(max_length=128, unique=True)  # host:pid
    role = models.CharField(max_length=16, choices=Role.choices)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-beat_at"]

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


class Console(models.Model):
    """No table: only the operator console's permissions (superusers have them all)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_console", "Can view the dashboard and the live logs"),
            ("change_config", "Can edit the bot configuration"),
        ]
