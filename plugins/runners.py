"""A plugin's runner as the host keeps it, part of the plugin host (mixed into plugins.host.PluginHost):
start a runner with the plugin loaded in it, swap a loaded runner in (its components registered, the old
runner stopped), and restart a runner that died with exponential backoff (`plugins.restart_backoff_seconds`
doubling up to `restart_backoff_max_seconds`), leaving the plugin failed after `plugins.max_restarts`
crashes within `restart_window_seconds`. The async methods run on the host's loop."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from core.retry import backoff
from plugins import bridge, gateways, protocol, sandbox
from plugins.capabilities import make_context
from plugins.host_base import (
    CONFIG_FILE,
    UNLOAD_TIMEOUT,
    PluginCallTimeout,
    describe,
    plugin_settings,
    read_config,
    text_digest,
    write_atomic,
)
from plugins.limits import limits_for
from plugins.protocol import LoadResult
from plugins.records import ComponentInfo, PluginRecord, PluginState, now_iso
from plugins.supervisor import RunnerProcess

logger = logging.getLogger("plugins.host")

ADAPTER_NETWORK_WARNING = (
    "an adapter plugin with network {network}: it cannot reach this machine's loopback (a NapCat on 127.0.0.1); "
    "list its id in MAIBOT_PLUGIN_HOST_NETWORK if its platform side runs on this machine"
)


class RunnerLifecycle:
    """The runner-keeping part of PluginHost (see plugins.host for the state it uses)."""

    async def _start_runner(
        self, record: PluginRecord, config_text: str | None = None
    ) -> tuple[RunnerProcess, LoadResult]:
        """A new runner for `record` with the plugin loaded in it (or found disabled); raises with the
        reason when it cannot load. Does not touch the record: the caller swaps it in."""
        from django.conf import settings as django_settings

        settings = plugin_settings()
        if record.context is None:
            record.context = make_context(record)
        record.switches = {}  # the new runner's on_load switches its components again
        base = Path(django_settings.DATA_DIR)
        if config_text is None:
            config_text = await asyncio.to_thread(read_config, record.folder / CONFIG_FILE)  # off the loop
        limits = limits_for(record.plugin_id)
        record.limits = limits
        if record.manifest is not None and record.manifest.plugin_type == "adapter" and limits.network != "host":
            record.warnings = sorted({*record.warnings, ADAPTER_NETWORK_WARNING.format(network=limits.network)})
        record.sandbox = sandbox.describe(record.plugin_id, limits.network)
        process = RunnerProcess(
            folder=record.folder,
            plugin_id=record.plugin_id,
            data_dir=base / "plugin-data" / record.plugin_id,
            runtime_dir=base / "plugin-runtime" / record.plugin_id,
            limits=limits,
            call_handler=lambda method, payload, timeout: self._answer_call(record, process, method, payload, timeout),
            on_exit=lambda proc: self._on_runner_exit(record, proc),
        )
        self._processes = [p for p in self._processes if not p.discarded] + [process]
        try:
            await asyncio.wait_for(process.start(), settings.load_timeout)
            loaded = await process.request(
                lambda rid: protocol.Load(id=rid, config_text=config_text), settings.load_timeout
            )
            reply = protocol.load_result(loaded)  # ProtocolError (the plugin failed) when it is not one
        except BaseException as exc:
            await asyncio.shield(process.discard())
            if isinstance(exc, TimeoutError):
                raise PluginCallTimeout(f"did not load within {settings.load_timeout:g}s") from None
            raise
        if reply.disabled:
            await process.stop(UNLOAD_TIMEOUT)
        return process, reply

    async def _answer_call(
        self, record: PluginRecord, process: RunnerProcess, method: str, payload: dict, timeout_ms: Any
    ) -> Any:
        if method in gateways.HOST_METHODS:  # an adapter plugin's gateway (`process`: the runner that asks)
            return await gateways.host_method(record, process, method, payload)
        # The capabilities module answers exactly as it did for in-process plugins.
        return await record.context._rpc_call(method, record.plugin_id, payload, timeout_ms)

    def _settle_load(self, record: PluginRecord, outcome: Any) -> bool:
        """Record what starting a runner for a not-yet-loaded plugin gave (the runner, or an exception)."""
        if isinstance(outcome, BaseException):
            self._refuse(record, f"{type(outcome).__name__}: {outcome}"[:2000], PluginState.FAILED)
            return False
        process, reply = outcome
        self._apply(record, process, reply)
        return record.state == PluginState.LOADED

    def _apply(self, record: PluginRecord, process: RunnerProcess, reply: LoadResult) -> None:
        """Swap a freshly loaded runner in: the old one's components out, the new ones in, the old runner
        stopped (on_unload) in the background."""
        old = record.process
        self._unregister(record.plugin_id)
        record.warnings = sorted(set(record.warnings) | set(reply.warnings))
        record.config = dict(reply.config)
        record.default_values, record.config_schema = dict(reply.default_values), dict(reply.config_schema)
        record.config_digest = text_digest(reply.config_text)
        config_path = record.folder / CONFIG_FILE
        if reply.default_config and reply.config_text and not config_path.exists():
            write_atomic(config_path, reply.config_text)  # MaiBot writes the defaults on first load
        record.allow_hot_reload = reply.allow_hot_reload
        record.reloaded_at = now_iso()
        record.reload_error = ""
        if reply.disabled:
            record.process = None
            record.components = []
            record.runner_state = "stopped"
            record.state = PluginState.DISABLED
            record.reason = "disabled in its config.toml ([plugin] enabled = false)"
            logger.info("plugin %s is disabled in its config.toml", record.plugin_id)
        else:
            self._register(record, process, reply.components)
        if old is not None and old is not process:
            asyncio.run_coroutine_threadsafe(old.stop(UNLOAD_TIMEOUT), self.loop)

    def _register(self, record: PluginRecord, process: RunnerProcess, components: list[protocol.Component]) -> None:
        """The loaded runner becomes the record's, and its components are registered (plugins.bridge)."""
        record.process = process
        record.runner_state = "running"
        record.components = [
            ComponentInfo(
                name=c.name,
                type=c.type,
                handler=str(c.metadata.get("handler_name", "")),
                metadata=c.metadata,
                enabled=record.switches.get((c.name, c.type), c.metadata.get("enabled") is not False),
            )
            for c in components
        ]
        record.state = PluginState.LOADED
        record.reason = ""
        self._registering = record.plugin_id
        try:
            bridge.register_components(self, record, life_only=self.life_only)
        finally:
            self._registering = ""
        for warning in record.warnings:
            logger.warning("plugin %s: %s", record.plugin_id, warning)
        logger.info(
            "plugin %s %s loaded (runner pid %s): %s",
            record.plugin_id,
            record.version,
            process.pid,
            ", ".join(describe(c) for c in record.components) or "no components",
        )

    def _on_runner_exit(self, record: PluginRecord, process: RunnerProcess) -> None:
        """On the host's loop: a runner died without being asked to. Restart it with backoff, or leave
        the plugin failed after too many crashes."""
        self._background(process.discard())  # its pipes closed now, not by the garbage collector
        gateways.runner_exited(record.plugin_id, process)  # its platforms' rows wait, not fail meanwhile
        if self._stopping or record.process is not process:
            return
        settings = plugin_settings()
        now = time.monotonic()
        record.crash_times = [t for t in record.crash_times if now - t < settings.restart_window_seconds] + [now]
        crashes = len(record.crash_times)
        why = f"its runner (pid {process.pid}) exited with code {process.exit_code}"
        if process.kill_reason:
            why = f"its runner (pid {process.pid}) was killed: {process.kill_reason}"
        if crashes > settings.max_restarts:
            reason = (
                f"{why}; {crashes} crashes within {settings.restart_window_seconds:g}s, not restarted (reload to retry)"
            )
            record.runner_state = "crashed"
            self._background(asyncio.to_thread(self._give_up, record, process, reason))
            return
        delay = backoff(settings.restart_backoff_seconds, crashes, most=settings.restart_backoff_max_seconds)
        record.runner_state = "restarting"
        record.error(f"{why}; restarting in {delay:g}s (crash {crashes} of at most {settings.max_restarts})")
        logger.error("plugin %s: %s; restarting in %gs", record.plugin_id, why, delay)
        self._later(delay, lambda: self._restart(record, process))

    def _give_up(self, record: PluginRecord, crashed: RunnerProcess, reason: str) -> None:
        with self._reload_lock:
            if record.process is not crashed:
                return  # reloaded meanwhile
            self._unregister(record.plugin_id)
            record.process = None
            record.runner_state = "crashed"
            self._refuse(record, reason, PluginState.FAILED)

    async def _restart(self, record: PluginRecord, crashed: RunnerProcess) -> None:
        if self._stopping or record.process is not crashed:
            return  # reloaded, disabled or stopped meanwhile
        try:
            process, reply = await self._start_runner(record)
        except Exception as exc:
            record.error(f"restarting its runner failed: {type(exc).__name__}: {exc}"[:500])
            self._on_runner_exit(record, crashed)  # counts as another crash (backoff grows)
            return
        await asyncio.to_thread(self._apply_restart, record, crashed, process, reply)

    def _apply_restart(
        self, record: PluginRecord, crashed: RunnerProcess, process: RunnerProcess, reply: LoadResult
    ) -> None:
        with self._reload_lock:
            if record.process is not crashed:
                asyncio.run_coroutine_threadsafe(process.stop(UNLOAD_TIMEOUT), self.loop)
                return
            record.process = None  # the crashed one needs no stopping
            # Counted before the new runner shows as running: a reader never sees it running uncounted.
            record.restarts += 1
            self._apply(record, process, reply)
            logger.info("plugin %s: runner restarted (pid %s)", record.plugin_id, process.pid)

    # --- reloading -----------------------------------------------------------------------------------
