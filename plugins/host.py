"""The plugin host: finds the plugins in $MAIBOT_DATA_DIR/plugins/<folder>/, checks and orders them, and
runs each loaded plugin in a runner subprocess of its own (plugins/runner.py, spoken to through
plugins/supervisor.py), never in this process: a plugin that raises, blocks its loop, leaks memory or
exits its process costs an error result, never the bot, another plugin or a planner cycle.

One runner per plugin (MaiBot 1.x runs one runner per group of plugins): a crash, a stuck loop or a
reload touches that plugin only, and a reload is simply a fresh process (no module purging). The cost is
one interpreter per plugin (docs/benchmarks.md).

The host is made of parts, one module each: loading a folder's plugins (plugins.loading), keeping their
runners (plugins.runners: start, swap in, restart after a crash), changing a running plugin
(plugins.reloading), calling its components (plugins.calls), the CPU watchdog (plugins.cpu_watchdog)
and the folder watcher (plugins.watcher). This module holds the host's state, its loop and its stop, and
the hosts of this process (`start`, `start_for_life_loop`).

Each runner starts in the plugin sandbox (plugins.sandbox: no data dir, no secrets, no loopback, its
processes ending with it) under its plugin's limits (plugins.limits); a plugin the sandbox cannot run is
refused saying why.

The host's work runs on the process's one background loop (core.aio.background_loop: never the ASGI
server's loop), which talks to the runners and answers their capability calls with plugins.capabilities;
nothing blocking runs there (file and /proc reads hop to threads). Every refusal and failure is kept with
its reason (`host.records`) and logged. Components become our mechanisms (plugins.bridge).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from core import aio
from plugins import events as plugin_events
from plugins import manifest as mf
from plugins import records
from plugins.calls import ComponentCalls
from plugins.cpu_watchdog import watch_cpu
from plugins.host_base import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    UNLOAD_TIMEOUT,
    PluginCallTimeout,
    ReloadOutcome,
    gather,
    plugin_settings,
    plugins_dir,
    text_digest,
)
from plugins.install import clear_stale_staging
from plugins.loading import PluginLoading
from plugins.records import PluginRecord, PluginState
from plugins.reloading import PluginReloading
from plugins.runners import RunnerLifecycle
from plugins.supervisor import RunnerProcess
from plugins.watcher import PluginWatcher

__all__ = [
    "CONFIG_FILE",
    "MAX_CONFIG_BYTES",
    "UNLOAD_TIMEOUT",
    "PluginCallTimeout",
    "PluginHost",
    "PluginState",
    "PluginWatcher",
    "ReloadOutcome",
    "plugins_dir",
    "text_digest",
]

logger = logging.getLogger(__name__)


class PluginHost(PluginLoading, RunnerLifecycle, PluginReloading, ComponentCalls):
    """`life_only`: the host of a cluster worker (see `start_for_life_loop`): only plugins that may
    declare life-loop tools are started, and only their tools of scope "life" are registered."""

    def __init__(self, host_version: str = mf.HOST_APPLICATION_VERSION, *, life_only: bool = False) -> None:
        self.host_version = host_version
        self.life_only = life_only
        self.records: dict[str, PluginRecord] = {}  # by plugin id (or "folder:<name>" when it has none)
        self.directory: Path | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the background loop, from load_all to stop
        self._undo: dict[str, list[Callable[[], None]]] = {}  # by plugin id: undo its registrations
        self._registering = ""
        self._reload_lock = threading.RLock()  # one load / reload / swap at a time
        self._stopping = False
        self._stopped = False
        self.watcher: PluginWatcher | None = None
        self._tasks: set[asyncio.Task] = set()  # this host's tasks on the loop (cancelled when it stops)
        self._timers: set[asyncio.TimerHandle] = set()  # restarts waiting for their backoff
        self._processes: list[RunnerProcess] = []  # every runner started and not yet discarded

    def _background(self, coro: Coroutine) -> None:
        """Run `coro` on the host's loop (called on it), keeping a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _later(self, delay: float, coro_fn: Callable[[], Coroutine]) -> None:
        """In `delay` seconds, run `coro_fn()` on the host's loop (called on it) unless the host stopped."""

        def fire() -> None:
            self._timers.discard(handle)
            if not self._stopping:
                self._background(coro_fn())

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)

    # --- the host's event loop -----------------------------------------------------------------------

    def _start_loop(self) -> None:
        """Use the process's background loop, and start this host's CPU watchdog on it."""
        if self.loop is not None:
            return
        self.loop = aio.background_loop()
        self.loop.call_soon_threadsafe(lambda: self._background(watch_cpu(self)))

    async def _cancel_tasks(self) -> None:
        """On the loop, when the host stops: its own tasks and timers end (the loop runs on)."""
        for handle in list(self._timers):
            handle.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the host's loop and wait at most `timeout` seconds (from any thread but
        that loop's). On timeout the coroutine is cancelled and PluginCallTimeout raised."""
        loop = self.loop
        if loop is None:
            coro.close()  # never started: close it rather than leave it un-awaited
            raise RuntimeError("the plugin host is not started")
        if _running_loop() is loop:
            coro.close()
            raise RuntimeError("PluginHost.run() on the host's own loop would wait for itself: await instead")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            if future.done():
                raise  # the call's own timeout (PluginCallTimeout, with its own limit), not this wait's
            future.cancel()
            raise PluginCallTimeout(f"did not finish within {timeout:g}s") from None

    def stop(self) -> None:
        """Unload every plugin (on_unload, at most UNLOAD_TIMEOUT seconds, then killed), stop the
        watcher and end this host's tasks on the loop. Once only; the loop itself runs on."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        with self._reload_lock:
            for plugin_id in list(self._undo):
                self._unregister(plugin_id)
            unloaded = sum(1 for r in self.records.values() if r.state == PluginState.LOADED)
            self._stop_runners()
            for record in self.records.values():
                record.process = None
                if record.runner_state:
                    record.runner_state = "stopped"
            loop, self.loop = self.loop, None
            if loop is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._cancel_tasks(), loop).result(5)
                except Exception:
                    logger.exception("ending the plugin host's tasks failed")
        logger.info("plugins unloaded (%d)", unloaded)

    def _stop_runners(self) -> None:
        """Every runner not yet discarded: the current ones, and old ones still being stopped."""
        runners = [p for p in self._processes if not p.discarded]
        if self.loop is None or not runners:
            return
        try:
            self.run(gather(*(p.stop(UNLOAD_TIMEOUT) for p in runners)), UNLOAD_TIMEOUT + 15)
        except Exception:
            logger.exception("stopping the plugin runners failed")
            for p in runners:
                self.loop.call_soon_threadsafe(p.kill)

    def on_unregister(self, undo: Callable[[], None], plugin_id: str = "") -> None:
        self._undo.setdefault(plugin_id or self._registering, []).append(undo)

    def _unregister(self, plugin_id: str) -> None:
        for undo in reversed(self._undo.pop(plugin_id, [])):
            try:
                undo()
            except Exception:
                logger.exception("unregistering a component of plugin %s failed", plugin_id)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# The host of this process (the ASGI server's); None until started.
host: PluginHost | None = None
_lock = threading.Lock()


def start() -> PluginHost:
    """Load the data dir's plugins into this process (once), and watch their folder for changes."""
    global host
    with _lock:
        if host is None:
            host = PluginHost()
            try:
                directory = plugins_dir()
                # Created when missing, so that a plugin put there later is seen (the watcher needs it).
                directory.mkdir(exist_ok=True)
                if left := clear_stale_staging():
                    logger.warning("removed %d plugin install folders left by an interrupted install", len(left))
                host.load_all(directory)
                settings = plugin_settings()
                host.watcher = PluginWatcher(
                    host, directory, debounce_ms=settings.reload_debounce_ms, hot_reload=settings.hot_reload
                ).start()
            except Exception:
                logger.exception("loading plugins failed; the bot runs without them")
            plugin_events.emit_start()
        return host


def stop() -> None:
    global host
    with _lock:
        if host is not None:
            plugin_events.emit_stop()
            host.stop()
            host = None


def _host_records() -> list[dict[str, PluginRecord]]:
    return [h.records for h in (host, life_host) if h is not None]


def _host_of(plugin_id: str) -> PluginHost | None:
    return next((h for h in (host, life_host) if h is not None and plugin_id in h.records), None)


records.host_records = _host_records
records.host_of = _host_of

# The host of this cluster worker for its life-loop turns (start_for_life_loop); None until first used.
life_host: PluginHost | None = None
_life_pid = 0


def start_for_life_loop() -> PluginHost | None:
    """In a cluster worker (a forked django-q2 process), the first life-loop model turn starts this
    process's own plugin host, as `life_clients.ensure()` connects the MCP servers: runners for the
    plugins that may declare life-loop tools (`PluginHost.life_only`), their tools of scope "life"
    registered in this process's registry, so the turn is offered them and the engine runs them with
    the usual recording, timeouts and error results. Later turns reuse it (once per process: a new pid,
    e.g. a recycled worker, starts a new one).

    No on_start / on_stop events are emitted here and no event handler, command or API is registered:
    those belong to the server's host (one bot start, one on_start). A plugin's own `on_load` /
    `on_unload` do run in each of its runners, i.e. once per worker that ran a model turn, as an MCP
    server linked to the life loop is started once per worker. No watcher: a plugin changed on disk
    reaches the workers when they are recycled or the cluster restarts; one whose folder was removed
    is unloaded before the next turn (a look at each folder per turn).

    The runners read their stdin from this process: when the worker exits, however it exits, the pipe
    closes and they exit (runner.EXIT_GRACE). A clean worker exit also unloads them first (on_unload),
    through multiprocessing's exit finalizers (atexit does not run in a forked worker)."""
    global life_host, _life_pid
    with _lock:
        if _life_pid == os.getpid():
            if life_host is not None:
                life_host.unload_removed()  # no watcher here: a removed plugin goes before the next turn
            return life_host
        _life_pid, life_host = os.getpid(), None
        directory = plugins_dir()
        if not directory.is_dir():
            return None
        host = PluginHost(life_only=True)
        life_host = host
        try:
            host.load_all(directory)
        finally:
            from multiprocessing import util

            util.Finalize(host, host.stop, exitpriority=10)
        tools = [c.name for r in host.records.values() for c in r.components if c.registered]
        logger.info("life-loop plugin host of worker %s: tools %s", os.getpid(), ", ".join(tools) or "none")
        return host


def start_on_first_call(app):
    """Wrap the ASGI application so the server process loads its plugins when it first serves
    (importing maibot.asgi alone starts nothing), in the background, and unloads them (on_unload)
    before the server stops."""
    started = False

    async def wrapper(scope, receive, send):
        nonlocal started
        if not started:
            started = True
            threading.Thread(target=start, name="maibot-plugins-load", daemon=True).start()
            from core.process import call_before_server_shutdown

            async def unload() -> None:
                await asyncio.to_thread(stop)

            call_before_server_shutdown(asyncio.get_running_loop(), unload)
        return await app(scope, receive, send)

    return wrapper
