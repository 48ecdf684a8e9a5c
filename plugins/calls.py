"""Calls into a plugin's components (tools, commands, @API, event and hook handlers), part of the plugin
host (mixed into plugins.host.PluginHost). Every call has a timeout. A call past it is cancelled in the
runner; a runner that cannot even confirm the cancellation (`plugins.cancel_grace`) is stuck and killed
(its exit handler restarts it). Each call is counted and timed on the plugin's record, its failure kept."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from plugins import protocol
from plugins.host_base import PluginCallTimeout, plugin_settings
from plugins.records import ComponentInfo, PluginRecord
from plugins.supervisor import RunnerGone, RunnerProcess

logger = logging.getLogger("plugins.host")


class ComponentCalls:
    """The calling part of PluginHost (see plugins.host for the state it uses)."""

    def invoke(self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float) -> Any:
        """Call a component's handler in the plugin's runner with `args` (keyword arguments), from a
        thread: the thread waits for the answer."""
        process = self._running(record)
        wait = timeout + plugin_settings().cancel_grace + 10
        return self.run(self._call(record, process, component, args, timeout), wait)

    async def ainvoke(
        self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float
    ) -> Any:
        """invoke() from async code on any event loop: no thread waits for the answer. The call runs
        on the host's loop with its own timeout and cancellation (a runner that cannot confirm it is
        killed); a caller that gives up first (is cancelled) leaves that to finish."""
        process = self._running(record)
        loop = self.loop
        if loop is None:
            raise RuntimeError("the plugin host is not started")
        future = asyncio.run_coroutine_threadsafe(self._call(record, process, component, args, timeout), loop)
        return await asyncio.shield(asyncio.wrap_future(future))

    def _running(self, record: PluginRecord) -> RunnerProcess:
        process = record.process
        if process is None or not process.alive:
            raise RunnerGone(f"plugin {record.plugin_id} is not running ({record.runner_state or record.state})")
        return process

    async def _call(
        self, record: PluginRecord, process: RunnerProcess, component: ComponentInfo, args: dict, timeout: float
    ) -> Any:
        """On the host's loop: one component call, counted and timed on the record, its failure kept."""
        record.calls += 1
        started = time.monotonic()
        try:
            return await self._invoke(record, process, component, args, timeout)
        except Exception as exc:
            record.error(f"{component.kind} {component.name}: {type(exc).__name__}: {exc}"[:500])
            if isinstance(exc, MemoryError):  # its runner's address-space limit (the runner lives on)
                limit = record.limits.memory_mb if record.limits else plugin_settings().runner_memory_mb
                record.refused("memory", f"{component.name} ran out of memory (plugins.runner_memory_mb = {limit})")
            raise
        finally:
            record.latency_ms_total += (time.monotonic() - started) * 1000

    async def _invoke(
        self, record: PluginRecord, process: RunnerProcess, component: ComponentInfo, args: dict, timeout: float
    ) -> Any:
        def request(request_id: int) -> protocol.Invoke:
            return protocol.Invoke(id=request_id, component=component.name, handler=component.handler, args=args)

        try:
            return await process.request(request, timeout)
        except TimeoutError as exc:
            (request_id,) = exc.args
            grace = plugin_settings().cancel_grace
            if not await process.cancel(request_id, grace):
                logger.error(
                    "plugin %s: %s did not stop within %gs of being cancelled: its runner is stuck, killing it",
                    record.plugin_id,
                    component.name,
                    grace,
                )
                record.error(f"{component.kind} {component.name} blocked its runner; the runner was killed")
                process.kill()  # the exit handler restarts it
            raise PluginCallTimeout(f"did not finish within {timeout:g}s") from None
