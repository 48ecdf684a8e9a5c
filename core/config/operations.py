"""The sections for how the bot runs over time: scheduled delivery, the life loop and its memory, and the
operator console (one pydantic model each)."""

from __future__ import annotations

from django.utils.translation import gettext_noop
from pydantic import Field

from core.config.base import Section


class SchedulingSection(Section):
    __doc__ = gettext_noop("""Scheduled private messages and their delivery.""")

    horizon_days: int = Field(
        365,
        ge=1,
        le=3650,
        title=gettext_noop("Schedule ahead at most (days)"),
        description=gettext_noop("How far ahead a message may be scheduled."),
    )
    max_text_length: int = Field(
        1024,
        ge=1,
        le=100_000,
        title=gettext_noop("Longest message (characters)"),
        description=gettext_noop("Longest scheduled message text."),
    )
    max_pending_per_session: int = Field(
        20,
        ge=1,
        le=10_000,
        title=gettext_noop("Pending messages per chat"),
        description=gettext_noop("Pending scheduled messages per chat."),
    )
    expire_after_seconds: int = Field(
        86400,
        ge=1,
        le=31_536_000,
        title=gettext_noop("Overdue expiry (seconds)"),
        description=gettext_noop(
            "An overdue message older than this (e.g. after downtime) fails as expired instead of sending."
        ),
    )
    max_attempts: int = Field(
        5,
        ge=1,
        le=100,
        title=gettext_noop("Send attempts"),
        description=gettext_noop("Send attempts before a message fails."),
    )
    retry_backoff_seconds: float = Field(
        2.0,
        gt=0,
        le=3600,
        title=gettext_noop("First retry delay (seconds)"),
        description=gettext_noop("First retry delay; each further retry doubles it."),
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Claim lease (seconds)"),
        description=gettext_noop(
            "Backstop: a claimed message not finished within this is taken back and sent once by a "
            "cluster. One whose cluster died is taken back as soon as that cluster's heartbeat runs out "
            "(console.heartbeat_seconds)."
        ),
    )
    poll_interval: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Safety poll interval (seconds)"),
        description=gettext_noop(
            "Safety net (seconds): every write that makes work due wakes the dispatcher, which otherwise "
            "sleeps until the next due instant; it looks anyway after this long, in case a wake-up was lost."
        ),
    )
    batch_size: int = Field(
        2000,
        ge=1,
        le=10_000,
        title=gettext_noop("Messages per dispatch round"),
        description=gettext_noop("Messages the dispatcher claims per round."),
    )


class ConsoleSection(Section):
    __doc__ = gettext_noop("""The operator console: config hot reload, live logs, health checks.""")

    reload_debounce_ms: int = Field(
        300,
        ge=10,
        le=10_000,
        title=gettext_noop("Config reload wait (ms)"),
        description=gettext_noop(
            "Config file changes are applied once the file has been quiet this long (milliseconds)."
        ),
        json_schema_extra={"requires_restart": True},  # the file watcher reads it when it starts
    )
    log_level: str = Field(
        "INFO",
        max_length=8,
        pattern=r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)$",
        title=gettext_noop("Log level"),
        description=gettext_noop(
            "Lowest level of log records kept for the live log page (DEBUG, INFO, WARNING, ERROR)."
        ),
    )
    log_retention_rows: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        title=gettext_noop("Log lines kept"),
        description=gettext_noop("Log lines kept for the live log page; older ones are deleted."),
    )
    log_retention_days: int = Field(
        7,
        ge=1,
        le=365,
        title=gettext_noop("Log retention (days)"),
        description=gettext_noop("Log lines older than this many days are deleted."),
    )
    heartbeat_seconds: float = Field(
        2.0,
        gt=0,
        le=300,
        title=gettext_noop("Heartbeat interval (seconds)"),
        description=gettext_noop(
            "How often each server and cluster process writes its heartbeat (seconds). A process silent "
            "for 4 times this counts as dead: the others take back the messages it had claimed and send them."
        ),
    )
    cluster_stale_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Cluster heartbeat stale after (seconds)"),
        description=gettext_noop(
            "/healthz reports the cluster down when its last heartbeat is older than this (seconds)."
        ),
    )
    health_requires_adapter: bool = Field(
        False,
        title=gettext_noop("Healthy only with an adapter"),
        description=gettext_noop("/healthz reports unhealthy (503) while no platform adapter is connected."),
    )


class LifeSection(Section):
    __doc__ = gettext_noop(
        """The life loop (timers, inner state) and the model's memory (slots, summaries, scratch notes)."""
    )

    turn_timeout: float = Field(
        120.0,
        gt=0,
        le=3600,
        title=gettext_noop("Turn timeout (seconds)"),
        description=gettext_noop("Hard timeout of one life-loop turn (seconds)."),
    )
    max_timers_per_session: int = Field(
        20,
        ge=1,
        le=10_000,
        title=gettext_noop("Timers per chat"),
        description=gettext_noop("Active timers one chat may have (set_timer refuses more)."),
    )
    max_payload_length: int = Field(
        2000,
        ge=1,
        le=100_000,
        title=gettext_noop("Longest timer payload (characters)"),
        description=gettext_noop("Longest timer payload (characters)."),
    )
    firing_requeue_seconds: float = Field(
        300.0,
        gt=0,
        le=86_400,
        title=gettext_noop("Timer requeue (seconds)"),
        description=gettext_noop(
            "A timer firing no worker has started after this long is handed to the task queue again."
        ),
    )
    inner_state_max_length: int = Field(
        4000,
        ge=1,
        le=100_000,
        title=gettext_noop("Longest inner state (characters)"),
        description=gettext_noop("Longest inner state text the model or an operator may write."),
    )
    memory_max_slots: int = Field(
        100,
        ge=1,
        le=10_000,
        title=gettext_noop("Memory slots per scope"),
        description=gettext_noop("Memory slots per scope: global, and each chat, may hold this many facts."),
    )
    memory_max_content_length: int = Field(
        300,
        ge=1,
        le=10_000,
        title=gettext_noop("Longest memory (characters)"),
        description=gettext_noop("Longest memory slot content."),
    )
    summary_every_messages: int = Field(
        50,
        ge=0,
        le=100_000,
        title=gettext_noop("Summarize every (messages)"),
        description=gettext_noop("Refresh a chat's rolling summary after this many new messages (0: never summarize)."),
    )
    summary_max_messages: int = Field(
        200,
        ge=1,
        le=5000,
        title=gettext_noop("Messages per summary at most"),
        description=gettext_noop("At most this many new messages are read by one summary refresh."),
    )
    scratch_notes_shown: int = Field(
        10,
        ge=0,
        le=200,
        title=gettext_noop("Scratch notes shown"),
        description=gettext_noop("The latest scratch notes shown to the planner."),
    )
