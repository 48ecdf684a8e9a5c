"""What the host knows of each plugin: its state (and why), its components, its call counts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from plugins import manifest as mf
from plugins.limits import Meter

logger = logging.getLogger("plugins.host")
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two log lines about one plugin's refusals of one kind


class PluginState(StrEnum):
    LOADED = "loaded"
    REFUSED = "refused"  # never imported: manifest, versions, dependencies
    FAILED = "failed"  # imported (or tried to) and broke: import error, create_plugin, config, on_load
    DISABLED = "disabled"  # its config.toml says [plugin] enabled = false
    REMOVED = "removed"  # its folder went away while the host ran: unloaded


def _no_hosts() -> list[dict[str, PluginRecord]]:
    return []


# The records of this process's plugin hosts (the chat host, the life-loop host), for a capability that
# reads another plugin's record (config.get_plugin). plugins.host installs the lookup: this module sits
# below the host, which must not be imported back from the capabilities it serves.
host_records: Callable[[], list[dict[str, PluginRecord]]] = _no_hosts
# The host holding a plugin (to reload it: component.reload_plugin); installed by plugins.host likewise.
host_of: Callable[[str], Any] = lambda plugin_id: None  # noqa: E731


@dataclass
class ComponentInfo:
    name: str
    type: str  # the SDK's: TOOL, COMMAND, EVENT_HANDLER, …
    handler: str  # the plugin method
    metadata: dict[str, Any]
    registered: bool = False
    note: str = ""  # why it is not registered (unsupported type, name taken…)
    # Offered / asked (a tool, a command): declared `enabled`, switched by component.enable / disable.
    enabled: bool = True

    @property
    def kind(self) -> str:
        if self.type == "TOOL" and self.metadata.get("legacy_action"):
            return "ACTION"
        return self.type


@dataclass
class PluginRecord:
    folder: Path
    plugin_id: str = ""
    state: PluginState = PluginState.REFUSED
    reason: str = ""
    manifest: mf.Manifest | None = None
    context: Any = None  # the host-side PluginContext whose rpc_call answers the runner's cap.call
    process: Any = None  # its runner (plugins.supervisor.RunnerProcess) while one runs
    config: dict[str, Any] = field(default_factory=dict)  # its config.toml as its config_model normalized it
    default_values: dict[str, Any] = field(default_factory=dict)  # its SDK's default config (component.*)
    config_schema: dict[str, Any] = field(default_factory=dict)  # its SDK's WebUI config schema
    config_digest: str = ""  # of the config.toml text in force (the watcher skips our own writes)
    allow_hot_reload: bool = True
    runner_state: str = ""  # running / restarting / crashed / stopped
    restarts: int = 0
    crash_times: list[float] = field(default_factory=list)
    reloaded_at: str = ""
    reload_error: str = ""  # the last failed reload (the previous version kept running)
    last_install: Any = None  # plugins.deps.InstallOutcome of the last dependency installation
    latency_ms_total: float = 0.0
    components: list[ComponentInfo] = field(default_factory=list)
    # (name, type) -> enabled: what the plugin switched with component.enable / disable since its runner
    # started (its on_load switches before the host has its components: applied when they register).
    switches: dict[tuple[str, str], bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unsupported_capabilities: list[str] = field(default_factory=list)  # declared, not answered here
    calls: int = 0
    errors: int = 0
    recent_errors: list[str] = field(default_factory=list)
    sandbox: str = ""  # how its runner is contained (plugins.sandbox), as the admin shows it
    limits: Any = None  # plugins.limits.PluginLimits its runner started with
    meter: Meter = field(default_factory=Meter)  # its send and media budgets
    refusals: dict[str, int] = field(default_factory=dict)  # by limit (sends, media, cpu): how often
    last_refusal: str = ""
    _refusal_logged: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.manifest.name if self.manifest else self.folder.name

    @property
    def version(self) -> str:
        return self.manifest.version if self.manifest else ""

    @property
    def runner_pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.alive else None

    @property
    def mean_latency_ms(self) -> float:
        return self.latency_ms_total / self.calls if self.calls else 0.0

    @property
    def declared_capabilities(self) -> list[str]:
        return list(self.manifest.capabilities) if self.manifest else []

    def error(self, text: str) -> None:
        self.errors += 1
        self.recent_errors = [*self.recent_errors[-19:], f"{now_iso()} {text}"]

    def refused(self, kind: str, reason: str) -> None:
        """A limit refused the plugin something: counted, kept as the last refusal, and logged (once a
        minute per kind: a plugin hammering its limit does not flood the log)."""
        self.refusals[kind] = self.refusals.get(kind, 0) + 1
        self.last_refusal = f"{now_iso()} {reason}"
        now = time.monotonic()
        if now - self._refusal_logged.get(kind, -REFUSAL_LOG_INTERVAL) >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged[kind] = now
            count = self.refusals[kind]
            logger.warning("plugin %s refused (%s limit, %d so far): %s", self.plugin_id, kind, count, reason)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ComponentHost(Protocol):
    """What plugins.bridge needs of the host: calling a component (from a thread, or awaited from async
    code), and undoing a registration."""

    def invoke(self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float) -> Any: ...

    async def ainvoke(
        self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float
    ) -> Any: ...

    def on_unregister(self, undo: Callable[[], None], plugin_id: str = "") -> None:
        """`undo` runs when the plugin (`plugin_id`, default the one registering) is unregistered."""


def parameters_schema(metadata: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments from the SDK's declaration (typed parameters or raw)."""
    typed = metadata.get("parameters") or []
    if typed:
        properties: dict[str, Any] = {}
        required = []
        for p in typed:
            prop: dict[str, Any] = {"type": p.get("param_type") or "string"}
            if p.get("description"):
                prop["description"] = p["description"]
            if p.get("enum_values"):
                prop["enum"] = list(p["enum_values"])
            if p.get("items_schema"):
                prop["items"] = p["items_schema"]
            if p.get("properties"):
                prop["properties"] = p["properties"]
            if p.get("default") is not None:
                prop["default"] = p["default"]
            properties[p["name"]] = prop
            if p.get("required"):
                required.append(p["name"])
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        return schema
    raw = metadata.get("parameters_raw") or {}
    if raw.get("type") == "object":
        return dict(raw)
    if raw:
        return {"type": "object", "properties": dict(raw)}
    return {"type": "object", "properties": {}}
