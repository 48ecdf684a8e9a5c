"""The sections for what the bot connects to and runs: the adapter gateway, the HTTP API, MCP servers and
plugins (one pydantic model each)."""

from __future__ import annotations

from django.utils.translation import gettext_noop
from pydantic import Field, field_validator

from core.config.base import Section
from core.config.entries import McpServerEntry, PluginLimitsEntry
from core.config.sections import TABLE


class GatewaySection(Section):
    __doc__ = gettext_noop(
        """Adapter connections, the browser chat page, and delivery of outbound messages (the outbox)."""
    )

    offline_expiry_seconds: int = Field(
        3600,
        ge=1,
        le=2_592_000,
        title=gettext_noop("Adapter offline expiry (seconds)"),
        description=gettext_noop(
            "An outbound message waiting longer than this for its adapter fails (adapter_offline)."
        ),
    )
    max_backlog: int = Field(
        20_000,
        ge=10,
        le=1_000_000,
        title=gettext_noop("Adapter frame backlog"),
        description=gettext_noop(
            "Frames from one adapter connection waiting to be stored; past this the connection is "
            "flooding and is closed (1008)."
        ),
    )
    delivery_lease_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        title=gettext_noop("Delivery lease (seconds)"),
        description=gettext_noop(
            "Backstop: an outbound message claimed for delivery and not marked within this is taken back "
            "(a server marks its claims within a second; one that died loses them as soon as its heartbeat runs out, "
            "see console.heartbeat_seconds). Taken back, it is handed over again where the platform's adapter echoes "
            "deliveries (within max_delivery_attempts: twice if it had reached the platform but its echo was lost), "
            "and fails as delivery_interrupted where it does not (never sent twice). Not scheduling.lease_seconds."
        ),
    )
    outbox_poll_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Outbox safety poll (seconds)"),
        description=gettext_noop(
            "Safety net (seconds), without Redis: every outbound message wakes the servers through their "
            "local wake sockets; a server looks anyway after this long, in case a wake-up was lost."
        ),
    )
    outbox_poll_seconds_with_redis: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Outbox safety poll with Redis (seconds)"),
        description=gettext_noop(
            "Safety net (seconds), with Redis: every outbound message wakes the servers through the channel "
            "layer; a server looks anyway after this long, in case a wake-up was lost."
        ),
    )
    outbox_sweep_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        title=gettext_noop("Outbox sweep (seconds)"),
        description=gettext_noop(
            "Safety net (seconds) for settling outbound messages past the offline expiry, past their "
            "delivery lease, or claimed by a server that died: each server settles them when the next is due, and "
            "when another server's heartbeat runs out, and anyway after this long."
        ),
    )
    confirm_seconds: float = Field(
        10.0,
        ge=1,
        le=3600,
        title=gettext_noop("Delivery echo wait (seconds)"),
        description=gettext_noop(
            "For a platform whose adapter echoes deliveries: a message handed over with no echo within "
            "this is handed over again (the wait doubles with each attempt). On a platform not yet known to echo, "
            "one window without an echo shows that its adapter does not (learned once)."
        ),
    )
    max_delivery_attempts: int = Field(
        5,
        ge=1,
        le=20,
        title=gettext_noop("Delivery attempts"),
        description=gettext_noop(
            "Hand-overs of one message at most, for a platform whose adapter echoes; then it is `unconfirmed`."
        ),
    )
    keepalive_seconds: float = Field(
        15.0,
        # daphne checks its websockets every 2 s and takes its ping options in whole seconds: below 6 s
        # the promise could not be kept (maibot/management/commands/serve.py, keepalive_options).
        ge=6,
        le=300,
        title=gettext_noop("Keep-alive (seconds)"),
        description=gettext_noop(
            "A dead or frozen adapter (or browser page) is dropped within this: the server pings "
            "every connection that is idle (websocket ping / Engine.IO ping) and closes it when no answer comes."
        ),
        json_schema_extra={"requires_restart": True},  # daphne and the Socket.IO server take it at start
    )
    browser_max_text_length: int = Field(
        4000,
        ge=1,
        le=100_000,
        title=gettext_noop("Chat page message length (characters)"),
        description=gettext_noop("Longest message the operator chat page (/chat/) accepts."),
    )


class ApiSection(Section):
    __doc__ = gettext_noop("""The proactive message HTTP API.""")

    rate_limit_per_minute: int = Field(
        60,
        ge=1,
        le=1_000_000,
        title=gettext_noop("Requests per minute per token"),
        description=gettext_noop("Requests per minute per API token."),
    )
    max_text_length: int = Field(
        1024,
        ge=1,
        le=100_000,
        title=gettext_noop("Longest text (characters)"),
        description=gettext_noop("Longest text a proactive message may carry."),
    )
    max_image_bytes: int = Field(
        1_500_000,
        ge=1,
        le=1_800_000,
        title=gettext_noop("Largest image (bytes)"),
        description=gettext_noop(
            "Largest base64 image a proactive message may carry (decoded bytes). Capped below the "
            "2.5 MB request body limit, which base64 (4/3 of the size) must fit in."
        ),
    )


class McpSection(Section):
    __doc__ = gettext_noop("""MCP servers whose tools join the bot's planner (the bot's own MCP endpoint is /mcp).""")

    servers: list[McpServerEntry] = Field(
        default_factory=list,
        max_length=32,
        title=gettext_noop("MCP servers"),
        description=gettext_noop(
            "MCP servers ([[mcp.servers]]: name, command with args and env or url with headers, tools, "
            "scopes, call_timeout_seconds, connect_timeout_seconds, enabled)."
        ),
        json_schema_extra=TABLE,
    )

    @field_validator("servers")
    @classmethod
    def _unique_names(cls, servers: list[McpServerEntry]) -> list[McpServerEntry]:
        names = [s.name for s in servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"server names must be unique; repeated: {', '.join(duplicates)}")
        return servers


class PluginsSection(Section):
    __doc__ = gettext_noop(
        """MaiBot SDK plugins ($MAIBOT_DATA_DIR/plugins/): their runner subprocesses, hot reload, dependencies."""
    )

    load_timeout: float = Field(
        30.0,
        gt=0,
        le=600,
        title=gettext_noop("Load timeout (seconds)"),
        description=gettext_noop("A plugin's runner must start and finish on_load within this (seconds)."),
    )
    cancel_grace: float = Field(
        2.0,
        gt=0,
        le=60,
        title=gettext_noop("Cancel grace (seconds)"),
        description=gettext_noop(
            "A runner must confirm a cancelled call (timed out) within this, or it is stuck and restarted (seconds)."
        ),
    )
    restart_backoff_seconds: float = Field(
        1.0,
        gt=0,
        le=600,
        title=gettext_noop("Restart delay (seconds)"),
        description=gettext_noop("Wait before restarting a crashed runner; doubles on each crash (seconds)."),
    )
    restart_backoff_max_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        title=gettext_noop("Longest restart delay (seconds)"),
        description=gettext_noop("The longest wait before restarting a crashed runner (seconds)."),
    )
    max_restarts: int = Field(
        5,
        ge=0,
        le=100,
        title=gettext_noop("Crashes before giving up"),
        description=gettext_noop(
            "Crashes within restart_window_seconds after which a plugin is left failed (reload to retry)."
        ),
    )
    restart_window_seconds: float = Field(
        600.0,
        ge=1,
        le=86_400,
        title=gettext_noop("Crash window (seconds)"),
        description=gettext_noop("The window max_restarts counts crashes in (seconds)."),
    )
    runner_memory_mb: int = Field(
        2048,
        ge=0,
        le=65_536,
        title=gettext_noop("Runner memory (MB)"),
        description=gettext_noop(
            "Address-space limit of each plugin runner (MB; 0: none). A plugin over it gets MemoryError."
        ),
    )
    network: str = Field(
        "isolated",
        max_length=16,
        pattern=r"^(isolated|none)$",
        title=gettext_noop("Runner network"),
        description=gettext_noop(
            "A runner's network: isolated (the internet through slirp4netns, never this machine's "
            "loopback services; no network when slirp4netns is not installed) or none. A plugin the deployment "
            "lists in MAIBOT_PLUGIN_HOST_NETWORK gets this machine's network instead."
        ),
    )
    runner_cpu_seconds_per_minute: float = Field(
        30.0,
        ge=1,
        le=3600,
        title=gettext_noop("Runner CPU per minute (seconds)"),
        description=gettext_noop(
            "CPU time a runner (all its processes) may use in any minute (seconds); past it the runner "
            "is killed and restarted like a crashed one."
        ),
    )
    runner_max_processes: int = Field(
        128,
        ge=8,
        le=4096,
        title=gettext_noop("Runner processes at most"),
        description=gettext_noop("Processes and threads a runner may have at once (RLIMIT_NPROC)."),
    )
    runner_max_open_files: int = Field(
        256,
        ge=32,
        le=65_536,
        title=gettext_noop("Runner open files at most"),
        description=gettext_noop("Files a runner may have open at once."),
    )
    runner_max_file_mb: int = Field(
        256,
        ge=1,
        le=65_536,
        title=gettext_noop("Largest runner file (MB)"),
        description=gettext_noop("The largest file a runner may write (MB), and the size of its private /tmp."),
    )
    sends_per_minute: int = Field(
        60,
        ge=1,
        le=100_000,
        title=gettext_noop("Sends per minute"),
        description=gettext_noop(
            "Messages a plugin may send (send.*) in any minute; past it a send fails with the reason."
        ),
    )
    media_mb_per_minute: int = Field(
        50,
        ge=1,
        le=100_000,
        title=gettext_noop("Media per minute (MB)"),
        description=gettext_noop(
            "Image, emoji and voice bytes a plugin may send, and PNG bytes it may render, in any minute (MB)."
        ),
    )
    limits: list[PluginLimitsEntry] = Field(
        default_factory=list,
        max_length=500,
        title=gettext_noop("Per-plugin limits"),
        description=gettext_noop(
            "Per-plugin limits ([[plugins.limits]]: plugin = its id, then any of network, "
            "runner_memory_mb, runner_cpu_seconds_per_minute, runner_max_processes, runner_max_open_files, "
            "runner_max_file_mb, sends_per_minute, media_mb_per_minute)."
        ),
        json_schema_extra=TABLE,
    )
    hot_reload: bool = Field(
        True,
        title=gettext_noop("Hot reload"),
        description=gettext_noop(
            "Reload a plugin when one of its files or its config.toml changes, and load a plugin folder "
            "put in while running (a removed folder always unloads its plugin)."
        ),
        json_schema_extra={"requires_restart": True},
    )
    reload_debounce_ms: int = Field(
        500,
        ge=10,
        le=10_000,
        title=gettext_noop("Plugin reload wait (ms)"),
        description=gettext_noop(
            "Plugin file changes are applied once the folder has been quiet this long (milliseconds)."
        ),
        json_schema_extra={"requires_restart": True},
    )
    install_timeout: float = Field(
        300.0,
        gt=0,
        le=3600,
        title=gettext_noop("Dependency install timeout (seconds)"),
        description=gettext_noop("One dependency installation may take this long (seconds)."),
    )

    @field_validator("limits")
    @classmethod
    def _one_entry_per_plugin(cls, entries: list[PluginLimitsEntry]) -> list[PluginLimitsEntry]:
        ids = [e.plugin for e in entries]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"one [[plugins.limits]] entry per plugin; repeated: {', '.join(duplicates)}")
        return entries
