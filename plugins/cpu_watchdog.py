"""The CPU watchdog of a plugin host's runners: a task on the host's loop that kills a runner over its
plugin's CPU limit; the runner is then restarted as after a crash (plugins.runners)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from plugins.limits import cpu_seconds_of_trees, limits_for
from plugins.records import PluginRecord
from plugins.supervisor import RunnerProcess

logger = logging.getLogger("plugins.host")

CPU_CHECK_INTERVAL = 2.0  # seconds between two looks at the runners' CPU time


class WatchedHost(Protocol):
    """What the watchdog reads of the plugin host (plugins.host.PluginHost)."""

    records: dict[str, PluginRecord]
    _stopping: bool
    _processes: list[RunnerProcess]


async def watch_cpu(host: WatchedHost) -> None:
    """Every CPU_CHECK_INTERVAL seconds until the host stops, the CPU time each runner's processes used
    within the last minute; a runner over its plugin's runner_cpu_seconds_per_minute is killed (the calls
    in flight fail saying why) and restarted as after a crash."""
    while not host._stopping:
        await asyncio.sleep(CPU_CHECK_INTERVAL)
        running = [p for p in host._processes if p.alive and p.pid and not p.stopping]
        if not running:
            continue
        try:
            # /proc is read in a thread: nothing blocking runs on the host's loop.
            totals = await asyncio.to_thread(cpu_seconds_of_trees, [p.pid for p in running])
        except OSError:
            logger.exception("reading the plugin runners' CPU time failed")
            continue
        now = time.monotonic()
        for process in running:
            if process.pid not in totals:
                continue
            used = process.cpu.add(now, totals[process.pid])
            limit = limits_for(process.plugin_id).cpu_seconds_per_minute
            if used <= limit or not process.alive:
                continue
            reason = f"it used {used:.1f} s of CPU within a minute (plugins.runner_cpu_seconds_per_minute = {limit:g})"
            # Killed (its reason set) before the refusal is counted: whoever sees the count sees why.
            process.kill(reason)
            record = host.records.get(process.plugin_id)
            if record is not None:
                record.refused("cpu", f"plugin {process.plugin_id}: {reason}")
