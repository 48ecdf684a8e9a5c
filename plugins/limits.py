"""What one plugin may use: its limits as the operator set them (`[plugins]` and `[[plugins.limits]]` of
bot_config.toml, `MAIBOT_PLUGIN_HOST_NETWORK`), the budgets its sends and media draw from, and the CPU time
its runner's processes used.

Budgets are token buckets refilled continuously: "N a minute" lets a burst of N through, then one every
60/N seconds. A refusal raises PluginLimitExceeded, which the capability layer turns into an error for the
plugin and counts on the plugin's record (the admin shows it). Limits are read on every use, so an edited
config applies at once (the runner's own limits: from its next start).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

MB = 1024 * 1024
CPU_WINDOW = 60.0  # seconds the CPU limit counts over


class PluginLimitExceeded(RuntimeError):
    """A plugin asked for more than its limit; the message says which limit and its value."""


@dataclass(frozen=True)
class PluginLimits:
    network: str  # "isolated", "none" or "host"
    memory_mb: int
    cpu_seconds_per_minute: float
    max_processes: int
    max_open_files: int
    max_file_mb: int
    sends_per_minute: int
    media_mb_per_minute: int

    def describe(self) -> str:
        """The limits in one line, in the operator's language (the admin's Plugins page)."""
        from django.utils.translation import gettext, pgettext

        memory = f"{self.memory_mb} MB" if self.memory_mb else pgettext("memory limit", "unlimited")
        return gettext(
            "network %(network)s; memory %(memory)s per process; CPU %(cpu)s s a minute; %(processes)d processes; "
            "%(files)d open files; files up to %(file_mb)d MB; %(sends)d sends and %(media)d MB of media a minute"
        ) % {
            "network": self.network,
            "memory": memory,
            "cpu": f"{self.cpu_seconds_per_minute:g}",
            "processes": self.max_processes,
            "files": self.max_open_files,
            "file_mb": self.max_file_mb,
            "sends": self.sends_per_minute,
            "media": self.media_mb_per_minute,
        }


def limits_for(plugin_id: str) -> PluginLimits:
    """The limits of one plugin: its [[plugins.limits]] entry over the [plugins] values."""
    from django.conf import settings

    from core.config import get_config

    section = get_config().plugins
    entry = next((e for e in section.limits if e.plugin == plugin_id), None)

    def pick(name: str, default):
        value = getattr(entry, name) if entry is not None else None
        return default if value is None else value

    network = "host" if plugin_id in settings.MAIBOT_PLUGIN_HOST_NETWORK else pick("network", section.network)
    return PluginLimits(
        network=network,
        memory_mb=pick("runner_memory_mb", section.runner_memory_mb),
        cpu_seconds_per_minute=pick("runner_cpu_seconds_per_minute", section.runner_cpu_seconds_per_minute),
        max_processes=pick("runner_max_processes", section.runner_max_processes),
        max_open_files=pick("runner_max_open_files", section.runner_max_open_files),
        max_file_mb=pick("runner_max_file_mb", section.runner_max_file_mb),
        sends_per_minute=pick("sends_per_minute", section.sends_per_minute),
        media_mb_per_minute=pick("media_mb_per_minute", section.media_mb_per_minute),
    )


class Budget:
    """A token bucket of `capacity` a minute (capacity given on each use: the limit in force)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._level: float | None = None  # None: full
        self._at = time.monotonic()

    def _refill(self, capacity: float, now: float) -> float:
        level = capacity if self._level is None else self._level
        level = min(capacity, level + (now - self._at) * capacity / 60.0)
        self._at = now
        return level

    def take(self, amount: float, capacity: float) -> bool:
        """Take `amount` if the bucket holds it; False (nothing taken) when it does not."""
        with self._lock:
            level = self._refill(capacity, time.monotonic())
            if amount > level:
                self._level = level
                return False
            self._level = level - amount
            return True

    def spend(self, amount: float, capacity: float) -> None:
        """Take `amount` even past empty (for work already done); later takes wait for the refill."""
        with self._lock:
            self._level = self._refill(capacity, time.monotonic()) - amount

    def available(self, capacity: float) -> float:
        with self._lock:
            level = self._refill(capacity, time.monotonic())
            self._level = level
            return level


@dataclass
class Meter:
    """One plugin's budgets (on its record: they survive a runner's restart and a reload)."""

    sends: Budget = field(default_factory=Budget)
    media: Budget = field(default_factory=Budget)


class Metered(Protocol):
    """What the budgets need of a plugin's record (plugins.records.PluginRecord)."""

    plugin_id: str
    meter: Meter

    def refused(self, kind: str, reason: str) -> None: ...


def _refuse(record: Metered, kind: str, reason: str) -> None:
    record.refused(kind, reason)
    raise PluginLimitExceeded(reason)


def charge_send(record: Metered) -> None:
    """One message sent by the plugin; PluginLimitExceeded when it has sent its sends_per_minute."""
    limit = limits_for(record.plugin_id).sends_per_minute
    if not record.meter.sends.take(1, limit):
        reason = f"plugin {record.plugin_id} sent {limit} messages within a minute (plugins.sends_per_minute)"
        _refuse(record, "sends", reason)


def charge_media(record: Metered, size: int) -> None:
    """`size` bytes of media the plugin sends; PluginLimitExceeded when its budget does not hold them."""
    limit = limits_for(record.plugin_id).media_mb_per_minute
    if not record.meter.media.take(size, limit * MB):
        _refuse(
            record,
            "media",
            f"plugin {record.plugin_id} may send {limit} MB of media a minute (plugins.media_mb_per_minute); "
            f"{size} more bytes are over it",
        )


def check_media_left(record: Metered) -> None:
    """Before work whose output size is unknown (a render): refused while the media budget is spent."""
    limit = limits_for(record.plugin_id).media_mb_per_minute
    if record.meter.media.available(limit * MB) <= 0:
        _refuse(
            record,
            "media",
            f"plugin {record.plugin_id} used its {limit} MB of media for this minute (plugins.media_mb_per_minute)",
        )


def spend_media(record: Metered, size: int) -> None:
    """`size` bytes produced for the plugin (a render's PNG), counted after the work."""
    limit = limits_for(record.plugin_id).media_mb_per_minute
    record.meter.media.spend(size, limit * MB)


# --- CPU time ---------------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of_trees(roots: list[int]) -> dict[int, float]:
    """The CPU time (user + system) used by each root process and all its descendants, those still
    running and those already reaped (in their reaper's cutime/cstime). A root that is gone: absent.

    Reads /proc once for all roots. In a runner's pid namespace every orphan is reparented to the
    namespace's init, a descendant of the root, so a daemonized child is counted too."""
    children: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 15:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        used[pid] = sum(int(v) for v in fields[11:15]) / _TICKS
    totals: dict[int, float] = {}
    for root in roots:
        if root not in used:
            continue
        total, pending = 0.0, [root]
        while pending:
            pid = pending.pop()
            total += used.get(pid, 0.0)
            pending.extend(children.get(pid, ()))
        totals[root] = total
    return totals


@dataclass
class CpuWindow:
    """CPU seconds a runner used, sampled over time: how much within the last CPU_WINDOW seconds."""

    samples: list[tuple[float, float]] = field(default_factory=list)

    def add(self, now: float, total: float) -> float:
        """Record a sample; the CPU seconds used since the newest sample at least CPU_WINDOW old (since
        the first sample, while there is none that old)."""
        self.samples.append((now, total))
        while len(self.samples) > 1 and now - self.samples[1][0] >= CPU_WINDOW:
            self.samples.pop(0)
        return total - self.samples[0][1]
