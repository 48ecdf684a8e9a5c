"""The plugin host: finds the plugins in $MAIBOT_DATA_DIR/plugins/<folder>/, checks and orders them, and
runs each loaded plugin in a runner subprocess of its own (plugins/runner.py, spoken to through
plugins/supervisor.py), never in this process: a plugin that raises, blocks its loop, leaks memory or
exits its process costs an error result, never the bot, another plugin or a planner cycle.

One runner per plugin (MaiBot 1.x runs one runner per group of plugins): a crash, a stuck loop or a
reload touches that plugin only, and a reload is simply a fresh process (no module purging). The cost is
one interpreter per plugin (about 30 MB each).

Every call has a timeout. A call past it is cancelled in the runner; a runner that cannot even confirm
the cancellation (`plugins.cancel_grace`) is stuck and killed. A runner that dies is restarted with
exponential backoff (`plugins.restart_backoff_seconds` doubling up to `restart_backoff_max_seconds`),
and left failed after `plugins.max_restarts` crashes within `restart_window_seconds`. A reload (file
change, config edit, admin action) starts the new version in a new runner first; only when it loaded is
it swapped in, so a failed reload keeps the previous version running and shows why.

Each runner starts in the plugin sandbox (plugins.sandbox: no data dir, no secrets, no loopback, its
processes ending with it) under its plugin's limits (plugins.limits); a runner over its CPU limit is
killed and restarted as after a crash; a plugin the sandbox cannot run is refused saying why.

The host's own event loop (a thread, never the ASGI server's loop) talks to the runners and answers
their capability calls with plugins.capabilities. Every refusal and failure is kept with its reason
(`host.records`) and logged. Components become our mechanisms (plugins.bridge).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins import bridge, deps, sandbox
from plugins import events as plugin_events
from plugins import manifest as mf
from plugins.capabilities import SUPPORTED, make_context
from plugins.limits import cpu_seconds_of_trees, limits_for
from plugins.records import ComponentInfo, PluginRecord, PluginState, now_iso
from plugins.supervisor import RunnerGone, RunnerProcess

logger = logging.getLogger(__name__)

# Seconds a plugin's on_unload may take when its runner stops.
UNLOAD_TIMEOUT = 10.0
CPU_CHECK_INTERVAL = 2.0  # seconds between two looks at the runners' CPU time
CONFIG_FILE = "config.toml"
MAX_CONFIG_BYTES = 1024 * 1024


class PluginCallTimeout(TimeoutError):
    pass


@dataclass
class ReloadOutcome:
    ok: bool
    message: str


def plugins_dir() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "plugins"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _settings():
    from core.config import get_config

    return get_config().plugins


class PluginHost:
    """`life_only`: the host of a cluster worker (see `start_for_life_loop`): only plugins that may
    declare life-loop tools are started, and only their tools of scope "life" are registered."""

    def __init__(self, host_version: str = mf.HOST_APPLICATION_VERSION, *, life_only: bool = False) -> None:
        self.host_version = host_version
        self.life_only = life_only
        self.records: dict[str, PluginRecord] = {}  # by plugin id (or "folder:<name>" when it has none)
        self.directory: Path | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._undo: dict[str, list[Callable[[], None]]] = {}  # by plugin id: undo its registrations
        self._registering = ""
        self._reload_lock = threading.RLock()  # one load / reload / swap at a time
        self._stopping = False
        self._stopped = False
        self.watcher: PluginWatcher | None = None
        self._tasks: set[asyncio.Task] = set()
        self._processes: list[RunnerProcess] = []  # every runner started and not yet discarded

    def _background(self, coro: Coroutine) -> None:
        """Run `coro` on the host's loop (called on it), keeping a reference until it is done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the host's event loop -----------------------------------------------------------------------

    def _start_loop(self) -> None:
        if self.loop is not None:
            return
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            loop = self.loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                # Closed here, not by the garbage collector (whose ResourceWarnings, raised while
                # CPython 3.11 builds an AST elsewhere, end in "AST constructor recursion depth mismatch").
                for task in asyncio.all_tasks(loop):
                    task.cancel()
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()

        self._thread = threading.Thread(target=run, name="maibot-plugins", daemon=True)
        self._thread.start()
        ready.wait()
        self.loop.call_soon_threadsafe(lambda: self._background(self._watch_cpu()))

    async def _watch_cpu(self) -> None:
        """Every CPU_CHECK_INTERVAL seconds, the CPU time each runner's processes used within the last
        minute; a runner over its plugin's runner_cpu_seconds_per_minute is killed (the calls in flight
        fail saying why) and restarted as after a crash."""
        while not self._stopping:
            await asyncio.sleep(CPU_CHECK_INTERVAL)
            running = [p for p in self._processes if p.alive and p.pid and not p.stopping]
            if not running:
                continue
            try:
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
                reason = (
                    f"it used {used:.1f} s of CPU within a minute (plugins.runner_cpu_seconds_per_minute = {limit:g})"
                )
                record = self.records.get(process.plugin_id)
                if record is not None:
                    record.refused("cpu", f"plugin {process.plugin_id}: {reason}")
                process.kill(reason)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the host's loop and wait at most `timeout` seconds (from any thread but
        that loop's). On timeout the coroutine is cancelled and PluginCallTimeout raised."""
        if self.loop is None:
            coro.close()  # never started: close it rather than leave it un-awaited
            raise RuntimeError("the plugin host is not started")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            if future.done():
                raise  # the call's own timeout (PluginCallTimeout, with its own limit), not this wait's
            future.cancel()
            raise PluginCallTimeout(f"did not finish within {timeout:g}s") from None

    def stop(self) -> None:
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
            # Every runner not yet discarded: the current ones, and old ones still being stopped.
            runners = [p for p in self._processes if not p.discarded]
            unloaded = sum(1 for r in self.records.values() if r.state == PluginState.LOADED)
            if self.loop is not None and runners:
                try:
                    self.run(_gather(*(p.stop(UNLOAD_TIMEOUT) for p in runners)), UNLOAD_TIMEOUT + 15)
                except Exception:
                    logger.exception("stopping the plugin runners failed")
                    for p in runners:
                        self.loop.call_soon_threadsafe(p.kill)
            for record in self.records.values():
                record.process = None
                if record.runner_state:
                    record.runner_state = "stopped"
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                if self._thread is not None:
                    self._thread.join(5)
                self.loop = None
        logger.info("plugins unloaded (%d)", unloaded)

    def on_unregister(self, undo: Callable[[], None]) -> None:
        self._undo.setdefault(self._registering, []).append(undo)

    def _unregister(self, plugin_id: str) -> None:
        for undo in reversed(self._undo.pop(plugin_id, [])):
            try:
                undo()
            except Exception:
                logger.exception("unregistering a component of plugin %s failed", plugin_id)

    # --- loading -----------------------------------------------------------------------------------

    def load_all(self, directory: Path | None = None) -> list[PluginRecord]:
        """Discover, check, order and load every plugin of `directory` (default: the data dir's).
        Plugins whose dependencies have loaded start together (their runners start in parallel)."""
        directory = directory or plugins_dir()
        self.directory = directory
        self._start_loop()
        if not directory.is_dir():
            logger.info("no plugins directory at %s: no plugins", directory)
            return []
        with self._reload_lock:
            candidates = self._discover(directory)
            if self.life_only:
                candidates = self._life_loop_candidates(candidates)
            order = self._ordered(candidates)
            level: dict[str, int] = {}
            for record in order:
                level[record.plugin_id] = 1 + max(
                    (level.get(d.id, 0) for d in record.manifest.plugin_dependencies), default=0
                )
            for wave in sorted(set(level.values())):
                batch = [r for r in order if level[r.plugin_id] == wave and self._dependencies_loaded(r)]
                started = self.run(
                    _gather(*(self._start_runner(r) for r in batch), return_exceptions=True),
                    _settings().load_timeout + 30,
                )
                for record, outcome in zip(batch, started, strict=True):
                    self._settle_load(record, outcome)
            if self.life_only:
                self._stop_idle()
        loaded = [r for r in self.records.values() if r.state == PluginState.LOADED]
        logger.info(
            "plugins loaded: %d of %d (%s)",
            len(loaded),
            len(self.records),
            ", ".join(f"{r.plugin_id or r.folder.name}={r.state}" for r in self.records.values()) or "none",
        )
        return list(self.records.values())

    def _life_loop_candidates(self, candidates: dict[str, PluginRecord]) -> dict[str, PluginRecord]:
        """The plugins a life-loop host starts: those whose Python files mention `life_loop` (the
        keyword of `@Tool(..., life_loop=True)`; what a plugin declares is only known once its code ran,
        so this cheap look at the text spares the worker a runner per unrelated plugin), and the plugins
        they depend on. The others are dropped from this host's records: not started here. Those that
        turn out to declare no life-loop tool are stopped once loaded (_stop_idle)."""
        wanted = {pid for pid, record in candidates.items() if _mentions_life_loop(record.folder)}
        pending = list(wanted)
        while pending:
            record = candidates.get(pending.pop())
            for dep in record.manifest.plugin_dependencies if record is not None else []:
                if dep.id not in wanted:
                    wanted.add(dep.id)
                    pending.append(dep.id)
        for pid in set(candidates) - wanted:
            del candidates[pid]
            self.records.pop(pid, None)
        for key in [k for k, r in self.records.items() if r.state == PluginState.REFUSED and k not in wanted]:
            if not _mentions_life_loop(self.records[key].folder):
                del self.records[key]  # refused, and not one a life-loop tool needs: the server reports it
        return candidates

    def _stop_idle(self) -> None:
        """A life-loop host, once loaded: stop the runners of plugins that turned out to register no
        life-loop tool and that no plugin with one depends on (their text mentioned `life_loop` only)."""
        needed = {pid for pid, r in self.records.items() if any(c.registered for c in r.components)}
        pending = list(needed)
        while pending:
            record = self.records.get(pending.pop())
            for dep in record.manifest.plugin_dependencies if record is not None and record.manifest else []:
                if dep.id not in needed:
                    needed.add(dep.id)
                    pending.append(dep.id)
        idle = {pid: r for pid, r in self.records.items() if r.state == PluginState.LOADED and pid not in needed}
        runners = []
        for pid, record in idle.items():
            self._unregister(pid)
            if record.process is not None:
                runners.append(record.process)
                record.process = None  # not a crash: its exit is not restarted
            del self.records[pid]
        if runners:
            self.run(_gather(*(p.stop(UNLOAD_TIMEOUT) for p in runners)), UNLOAD_TIMEOUT + 15)
            logger.info("life-loop host: stopped %s (no life-loop tool)", ", ".join(sorted(idle)))

    def _refuse(self, record: PluginRecord, reason: str, state: PluginState = PluginState.REFUSED) -> None:
        record.state = state
        record.reason = reason
        record.error(reason)
        logger.error("plugin %s (%s) %s: %s", record.plugin_id or "?", record.folder.name, state, reason)

    def _check(self, record: PluginRecord) -> str:
        """Read and check the manifest, host and SDK ranges and Python dependencies (installing them
        when the deployment enables it, plugins.deps); the reason it cannot load, or ""."""
        try:
            record.manifest = mf.read_manifest(record.folder)
        except mf.ManifestError as exc:
            return str(exc)
        record.plugin_id = record.manifest.id
        record.unsupported_capabilities = [c for c in record.manifest.capabilities if c not in SUPPORTED]
        try:
            record.warnings = mf.check_compatibility(record.manifest, host_version=self.host_version)
        except mf.ManifestError as exc:
            return str(exc)
        if refusal := sandbox.refusal():
            return refusal
        if unreadable := sandbox.unreadable(record.folder):
            return (
                f"its runner (an unprivileged user) cannot read {', '.join(unreadable)}: make the folder readable "
                f"by others (chmod -R a+rX {record.folder})"
            )
        if (wanted := deps.missing_requirements(record.manifest)) and deps.auto_install_enabled():
            record.last_install = deps.install(wanted)
        if missing := mf.missing_packages(record.manifest):
            return "missing Python dependencies: " + ", ".join(missing)
        return ""

    def _discover(self, directory: Path) -> dict[str, PluginRecord]:
        candidates: dict[str, PluginRecord] = {}
        folders = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        for folder in folders:
            if folder.name.casefold() in ("data", "__pycache__"):
                continue
            record = PluginRecord(folder=folder)
            try:
                record.manifest = mf.read_manifest(folder)
            except mf.ManifestError as exc:
                record.plugin_id = _raw_id(folder) or ""
                self.records[record.plugin_id or f"folder:{folder.name}"] = record
                self._refuse(record, str(exc))
                continue
            record.plugin_id = record.manifest.id
            if record.plugin_id in candidates or record.plugin_id in self.records:
                other = candidates.pop(record.plugin_id, None) or self.records[record.plugin_id]
                why = f"the plugin id {record.plugin_id} is used by two folders: {other.folder.name}, {folder.name}"
                self._refuse(other, why)
                self.records[f"folder:{folder.name}"] = record
                self._refuse(record, why)
                continue
            self.records[record.plugin_id] = record
            if reason := self._check(record):
                self._refuse(record, reason)
                continue
            candidates[record.plugin_id] = record
        return candidates

    def _ordered(self, candidates: dict[str, PluginRecord]) -> list[PluginRecord]:
        """Candidates in dependency order (Kahn). A plugin whose dependency is missing, refused, of the
        wrong version or in a cycle is refused, naming it."""
        pending = dict(candidates)
        changed = True
        while changed:  # refusing one plugin can strand those that depend on it
            changed = False
            for pid, record in list(pending.items()):
                for dep in record.manifest.plugin_dependencies:
                    other = pending.get(dep.id)
                    if other is None:
                        known = self.records.get(dep.id)
                        why = f"it is {known.state}: {known.reason}" if known else "it is not installed"
                        self._refuse(record, f"depends on plugin {dep.id}{dep.version_spec}, but {why}")
                    elif not mf.plugin_dependency_satisfied(dep, other.version):
                        why = f"depends on plugin {dep.id}{dep.version_spec}, but {other.version} is installed"
                        self._refuse(record, why)
                    else:
                        continue
                    del pending[pid]
                    changed = True
                    break
        order: list[PluginRecord] = []
        indegree = {pid: len(r.manifest.plugin_dependencies) for pid, r in pending.items()}
        ready = sorted(pid for pid, n in indegree.items() if n == 0)
        while ready:
            pid = ready.pop(0)
            order.append(pending[pid])
            for other_id, other in sorted(pending.items()):
                if any(d.id == pid for d in other.manifest.plugin_dependencies):
                    indegree[other_id] -= 1
                    if indegree[other_id] == 0:
                        ready.append(other_id)
        stuck = {pid for pid, n in indegree.items() if n > 0}
        for pid in sorted(stuck):
            cycle = _find_cycle(pid, {p: [d.id for d in pending[p].manifest.plugin_dependencies] for p in stuck})
            if cycle:
                self._refuse(pending[pid], "dependency cycle: " + " -> ".join(cycle))
            else:
                self._refuse(pending[pid], "depends on plugins caught in a dependency cycle")
        return order

    def _dependencies_loaded(self, record: PluginRecord) -> bool:
        for dep in record.manifest.plugin_dependencies:
            other = self.records.get(dep.id)
            if other is None or other.state != PluginState.LOADED:
                why = "is disabled" if other is not None and other.state == PluginState.DISABLED else "failed to load"
                self._refuse(record, f"depends on plugin {dep.id}, which {why}")
                return False
        return True

    # --- runners -----------------------------------------------------------------------------------

    async def _start_runner(self, record: PluginRecord, config_text: str | None = None) -> tuple[RunnerProcess, dict]:
        """A new runner for `record` with the plugin loaded in it (or found disabled); raises with the
        reason when it cannot load. Does not touch the record: the caller swaps it in."""
        from django.conf import settings as django_settings

        settings = _settings()
        if record.context is None:
            record.context = make_context(record)
        base = Path(django_settings.DATA_DIR)
        if config_text is None:
            config_text = _read_config(record.folder / CONFIG_FILE)
        limits = limits_for(record.plugin_id)
        record.limits = limits
        record.sandbox = sandbox.describe(record.plugin_id, limits.network)
        process = RunnerProcess(
            folder=record.folder,
            plugin_id=record.plugin_id,
            data_dir=base / "plugin-data" / record.plugin_id,
            runtime_dir=base / "plugin-runtime" / record.plugin_id,
            limits=limits,
            call_handler=lambda method, payload, timeout_ms: self._answer_call(record, method, payload, timeout_ms),
            on_exit=lambda proc: self._on_runner_exit(record, proc),
        )
        self._processes = [p for p in self._processes if not p.discarded] + [process]
        try:
            await asyncio.wait_for(process.start(), settings.load_timeout)
            message: dict[str, Any] = {"type": "load", "config_text": config_text}
            reply = await process.request(message, settings.load_timeout)
        except BaseException as exc:
            await asyncio.shield(process.discard())
            if isinstance(exc, TimeoutError):
                raise PluginCallTimeout(f"did not load within {settings.load_timeout:g}s") from None
            raise
        if reply.get("disabled"):
            await process.stop(UNLOAD_TIMEOUT)
        return process, reply

    async def _answer_call(self, record: PluginRecord, method: str, payload: dict, timeout_ms: Any) -> Any:
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

    def _apply(self, record: PluginRecord, process: RunnerProcess, reply: dict) -> None:
        """Swap a freshly loaded runner in: the old one's components out, the new ones in, the old runner
        stopped (on_unload) in the background."""
        old = record.process
        self._unregister(record.plugin_id)
        record.warnings = sorted(set(record.warnings) | set(reply.get("warnings") or []))
        record.config = dict(reply.get("config") or {})
        record.config_digest = text_digest(str(reply.get("config_text") or ""))
        config_path = record.folder / CONFIG_FILE
        if reply.get("default_config") and reply.get("config_text") and not config_path.exists():
            _write_atomic(config_path, str(reply["config_text"]))  # MaiBot writes the defaults on first load
        record.allow_hot_reload = bool(reply.get("allow_hot_reload", True))
        record.reloaded_at = now_iso()
        record.reload_error = ""
        if reply.get("disabled"):
            record.process = None
            record.components = []
            record.runner_state = "stopped"
            record.state = PluginState.DISABLED
            record.reason = "disabled in its config.toml ([plugin] enabled = false)"
            logger.info("plugin %s is disabled in its config.toml", record.plugin_id)
        else:
            record.process = process
            record.runner_state = "running"
            record.components = [
                ComponentInfo(
                    name=c["name"],
                    type=c["type"],
                    handler=str(c["metadata"].get("handler_name", "")),
                    metadata=c["metadata"],
                )
                for c in reply.get("components") or []
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
                ", ".join(_describe(c) for c in record.components) or "no components",
            )
        if old is not None and old is not process:
            asyncio.run_coroutine_threadsafe(old.stop(UNLOAD_TIMEOUT), self.loop)

    def _on_runner_exit(self, record: PluginRecord, process: RunnerProcess) -> None:
        """On the host's loop: a runner died without being asked to. Restart it with backoff, or leave
        the plugin failed after too many crashes."""
        self._background(process.discard())  # its pipes closed now, not by the garbage collector
        if self._stopping or record.process is not process:
            return
        settings = _settings()
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
        delay = min(settings.restart_backoff_seconds * 2 ** (crashes - 1), settings.restart_backoff_max_seconds)
        record.runner_state = "restarting"
        record.error(f"{why}; restarting in {delay:g}s (crash {crashes} of at most {settings.max_restarts})")
        logger.error("plugin %s: %s; restarting in %gs", record.plugin_id, why, delay)
        self.loop.call_later(delay, lambda: self._background(self._restart(record, process)))

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

    def _apply_restart(self, record: PluginRecord, crashed: RunnerProcess, process: RunnerProcess, reply: dict) -> None:
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

    def reload(self, plugin_id: str, *, config_text: str | None = None, source: str = "reload") -> ReloadOutcome:
        """Load the plugin's current files (and `config_text`, written to its config.toml only when it
        loads) in a new runner and swap it in. When that fails, the running version stays and the error
        is kept (`reload_error`); a plugin that was not loaded stays failed with the reason."""
        with self._reload_lock:
            record = self.records.get(plugin_id)
            if record is None:
                return ReloadOutcome(False, f"there is no plugin {plugin_id}")
            if record.state == PluginState.REMOVED:
                return ReloadOutcome(False, record.reason)
            was_loaded = record.state == PluginState.LOADED
            reason = self._check(record)
            if not reason and record.manifest.id != plugin_id:
                reason = f"its manifest id changed to {record.manifest.id}; restart the bot to load it under that id"
            if not reason:
                for dep in record.manifest.plugin_dependencies:
                    other = self.records.get(dep.id)
                    if other is None or other.state != PluginState.LOADED:
                        reason = f"depends on plugin {dep.id}, which is not loaded"
                        break
            outcome: Any
            if reason:
                outcome = ValueError(reason)
            else:
                try:
                    outcome = self.run(self._start_runner(record, config_text), _settings().load_timeout * 2 + 10)
                except Exception as exc:
                    outcome = exc
            if isinstance(outcome, BaseException):
                text = reason or f"{type(outcome).__name__}: {outcome}"[:2000]
                if was_loaded:
                    record.reload_error = f"{now_iso()} {source}: {text}"
                    record.error(f"{source} failed, the previous version keeps running: {text}")
                    logger.error(
                        "plugin %s: %s failed, the previous version keeps running: %s", plugin_id, source, text
                    )
                    return ReloadOutcome(False, f"{source} failed (the previous version keeps running): {text}")
                self._refuse(record, text, PluginState.REFUSED if reason else PluginState.FAILED)
                return ReloadOutcome(False, f"{source} failed: {text}")
            process, reply = outcome
            if config_text is not None:
                _write_atomic(record.folder / CONFIG_FILE, config_text)
            self._apply(record, process, reply)
            record.crash_times = []
            logger.info("plugin %s: %s → %s", plugin_id, source, record.state)
            return ReloadOutcome(True, f"{source}: {record.state}")

    def set_enabled(self, plugin_id: str, enabled: bool) -> ReloadOutcome:
        """Enable or disable a plugin as MaiBot does: `[plugin] enabled` in its config.toml (kept across
        restarts), applied at once."""
        import tomlkit

        record = self.records.get(plugin_id)
        if record is None:
            return ReloadOutcome(False, f"there is no plugin {plugin_id}")
        if record.state == PluginState.REMOVED:
            return ReloadOutcome(False, record.reason)
        path = record.folder / CONFIG_FILE
        try:
            document = tomlkit.parse(path.read_text(encoding="utf-8")) if path.is_file() else tomlkit.document()
        except Exception as exc:
            return ReloadOutcome(False, f"config.toml cannot be read: {exc}")
        section = document.get("plugin")
        if section is None:
            section = tomlkit.table()
            document["plugin"] = section
        section["enabled"] = enabled
        return self.reload(plugin_id, config_text=tomlkit.dumps(document), source="enable" if enabled else "disable")

    def install_dependencies(self, plugin_id: str) -> ReloadOutcome:
        """pip-install the plugin's missing Python dependencies, then load it (or reload it)."""
        record = self.records.get(plugin_id)
        if record is None or record.manifest is None:
            return ReloadOutcome(False, f"there is no plugin {plugin_id} with a valid manifest")
        if record.state == PluginState.REMOVED:
            return ReloadOutcome(False, record.reason)
        wanted = deps.missing_requirements(record.manifest)
        if not wanted:
            return ReloadOutcome(True, "every Python dependency is already installed")
        record.last_install = deps.install(wanted)
        if not record.last_install.ok:
            record.error(record.last_install.summary)
            return ReloadOutcome(False, record.last_install.summary)
        if record.state == PluginState.LOADED:
            return ReloadOutcome(True, record.last_install.summary)
        loaded = self.reload(plugin_id, source="install dependencies")
        return ReloadOutcome(loaded.ok, f"{record.last_install.summary}; {loaded.message}")

    def add_folder(self, folder: Path) -> ReloadOutcome:
        """A plugin folder that appeared while running: check it and load it (also a plugin whose
        folder was removed before, from wherever it is now)."""
        with self._reload_lock:
            plugin_id = _raw_id(folder)
            known = self.records.get(plugin_id) if plugin_id else None
            if known is not None and known.state != PluginState.REMOVED:
                return self.reload(plugin_id, source="file change")
            record = PluginRecord(folder=folder, plugin_id=plugin_id or "")
            self.records[plugin_id or f"folder:{folder.name}"] = record  # a removed one's record replaced
            if not plugin_id:
                reason = self._check(record)
                self._refuse(record, reason or "_manifest.json has no id")
                return ReloadOutcome(False, record.reason)
            return self.reload(plugin_id, source="new plugin")

    def remove_folder(self, folder: Path) -> ReloadOutcome:
        """A plugin folder that went away while running: its components are unregistered at once, its
        runner stopped (on_unload, at most UNLOAD_TIMEOUT seconds, then killed), and the plugin kept
        as removed, saying so, until its folder comes back."""
        with self._reload_lock:
            _, record = self.record_for_path(folder)
            if record is None or record.state == PluginState.REMOVED:
                return ReloadOutcome(True, f"{folder.name}: nothing was loaded from it")
            process, record.process = record.process, None  # not a crash: its exit is not restarted
            self._unregister(record.plugin_id)
            record.components = []
            record.runner_state = "stopped" if process is not None else ""
            record.reload_error = ""
            record.state = PluginState.REMOVED
            record.reason = f"its folder {folder.name}/ was removed from {folder.parent}; unloaded at {now_iso()}"
            logger.warning("plugin %s: its folder %s was removed; unloading it", record.plugin_id or "?", folder)
        if process is not None and self.loop is not None:
            try:
                self.run(process.stop(UNLOAD_TIMEOUT), UNLOAD_TIMEOUT + 15)
            except Exception:
                logger.exception("stopping the runner of removed plugin %s failed", record.plugin_id)
                self.loop.call_soon_threadsafe(process.kill)
        logger.info("plugin %s: unloaded (its folder was removed)", record.plugin_id or folder.name)
        return ReloadOutcome(True, record.reason)

    def unload_removed(self) -> list[ReloadOutcome]:
        """Unload the plugins whose folders went away (for a host without a watcher)."""
        records = list(self.records.values())
        gone = [r.folder for r in records if r.state != PluginState.REMOVED and not r.folder.is_dir()]
        return [self.remove_folder(folder) for folder in gone]

    def validate_config(self, plugin_id: str, text: str) -> ReloadOutcome:
        """Apply a config.toml edited in the admin: the plugin is reloaded with it, and the file written
        only when the plugin loads with it. Invalid: the reason, nothing written, the old config stays."""
        record = self.records.get(plugin_id)
        if record is None:
            return ReloadOutcome(False, f"there is no plugin {plugin_id}")
        if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
            return ReloadOutcome(False, f"config.toml is larger than {MAX_CONFIG_BYTES} bytes")
        return self.reload(plugin_id, config_text=text, source="config edit")

    def record_for_path(self, path: Path) -> tuple[Path | None, PluginRecord | None]:
        """The plugin folder a changed path is in, and its record (None for a new folder, or one whose
        plugin was removed)."""
        if self.directory is None:
            return None, None
        try:
            relative = path.resolve().relative_to(self.directory.resolve())
        except ValueError:
            return None, None
        if not relative.parts:
            return None, None
        folder = self.directory / relative.parts[0]
        for record in self.records.values():
            if record.state != PluginState.REMOVED and record.folder.resolve() == folder.resolve():
                return folder, record
        return folder, None

    # --- invoking components -----------------------------------------------------------------------

    def invoke(self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float) -> Any:
        """Call a component's handler in the plugin's runner with `args` (keyword arguments), from a
        thread: the thread waits for the answer."""
        process = self._running(record)
        return self.run(self._call(record, process, component, args, timeout), timeout + _settings().cancel_grace + 10)

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
                limit = record.limits.memory_mb if record.limits else _settings().runner_memory_mb
                record.refused("memory", f"{component.name} ran out of memory (plugins.runner_memory_mb = {limit})")
            raise
        finally:
            record.latency_ms_total += (time.monotonic() - started) * 1000

    async def _invoke(
        self, record: PluginRecord, process: RunnerProcess, component: ComponentInfo, args: dict, timeout: float
    ) -> Any:
        request = {"type": "invoke", "component": component.name, "handler": component.handler, "args": args}
        try:
            return await process.request(request, timeout)
        except TimeoutError as exc:
            (request_id,) = exc.args
            grace = _settings().cancel_grace
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


async def _gather(*coros: Coroutine, return_exceptions: bool = False) -> list[Any]:
    return await asyncio.gather(*coros, return_exceptions=return_exceptions)


def _read_config(path: Path) -> str | None:
    """A plugin's config.toml as the host sends it to the runner; None when there is none."""
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"config.toml is larger than {MAX_CONFIG_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class PluginWatcher:
    """Follows the plugins directory (watchfiles, like the bot config's watcher). A plugin whose folder
    is removed is unloaded, always. With `hot_reload`, a plugin is reloaded when one of its files or
    its config.toml changes, and a new folder is loaded. Our own config writes are recognised by their
    digest and skipped; a plugin with `allow_hot_reload = false` is not reloaded (reload it from the
    admin)."""

    def __init__(self, host: PluginHost, directory: Path, *, debounce_ms: int, hot_reload: bool = True) -> None:
        self.host = host
        self.directory = directory.resolve()
        self.debounce_ms = debounce_ms
        self.hot_reload = hot_reload
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()

    def _is_relevant(self, change: Any, path: str) -> bool:
        """Code anywhere in a plugin folder; its config.toml and _manifest.json at its top. Not the data
        files a plugin may write into its own folder (that would reload it in a loop)."""
        try:
            parts = Path(path).relative_to(self.directory).parts
        except ValueError:
            return False
        if not parts or any(p.startswith(".") or p == "__pycache__" for p in parts):
            return False
        if len(parts) == 1:
            return True  # a plugin folder appeared or went
        if len(parts) == 2 and parts[1] in (CONFIG_FILE, mf.MANIFEST_FILE):
            return True
        return parts[-1].endswith(".py")

    def start(self) -> PluginWatcher:
        self._thread = threading.Thread(target=self._run, name="maibot-plugin-watcher", daemon=True)
        self._thread.start()
        self.ready.wait(10)
        return self

    def _run(self) -> None:
        from core.reload import watch_files

        watch_files(
            self.directory,
            what="plugins",
            watch_filter=self._is_relevant,
            debounce_ms=self.debounce_ms,
            stop_event=self._stop,
            ready=self.ready,
            on_changes=self.handle,
        )

    def handle(self, paths: set[Path]) -> list[ReloadOutcome]:
        by_folder: dict[Path, set[Path]] = {}
        for path in paths:
            folder, _ = self.host.record_for_path(path)
            if folder is not None:
                by_folder.setdefault(folder, set()).add(path)
        outcomes = []
        # Removed folders first: a folder renamed is a removal and an addition, of the same plugin.
        for folder, changed in sorted(by_folder.items(), key=lambda item: (item[0].is_dir(), item[0])):
            if not folder.is_dir():
                outcomes.append(self.host.remove_folder(folder))
                continue
            if not self.hot_reload:
                continue
            _, record = self.host.record_for_path(folder)
            if record is None:
                if (folder / mf.MANIFEST_FILE).is_file():
                    outcomes.append(self.host.add_folder(folder))
                continue
            config = folder / CONFIG_FILE
            if changed == {config} and config.is_file():
                try:
                    if text_digest(config.read_text(encoding="utf-8")) == record.config_digest:
                        continue  # our own write (an admin edit, the generated default)
                except OSError:
                    continue
            if not record.allow_hot_reload and record.state == PluginState.LOADED:
                record.reload_error = (
                    f"{now_iso()} files changed on disk; not reloaded (allow_hot_reload = false): use Reload"
                )
                logger.info("plugin %s changed on disk; hot reload is off for it", record.plugin_id)
                continue
            if not record.plugin_id:
                outcomes.append(self.host.add_folder(folder))
                continue
            names = ", ".join(sorted(p.name for p in changed))
            outcomes.append(self.host.reload(record.plugin_id, source=f"hot reload ({names})"))
        return outcomes

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def _describe(component: ComponentInfo) -> str:
    return f"{component.kind} {component.name}" + ("" if component.registered else f" (skipped: {component.note})")


def _mentions_life_loop(folder: Path) -> bool:
    for path in folder.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        try:
            if b"life_loop" in path.read_bytes():
                return True
        except OSError:
            continue
    return False


def _raw_id(folder: Path) -> str | None:
    import json

    try:
        data = json.loads((folder / mf.MANIFEST_FILE).read_text(encoding="utf-8"))
    except Exception:
        return None
    value = data.get("id") if isinstance(data, dict) else None
    return value.strip()[:200] if isinstance(value, str) and value.strip() else None


def _find_cycle(start: str, edges: dict[str, list[str]]) -> list[str]:
    path: list[str] = []
    seen: set[str] = set()

    def walk(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in seen or node not in edges:
            return []
        seen.add(node)
        path.append(node)
        for nxt in edges[node]:
            if found := walk(nxt):
                return found
        path.pop()
        return []

    return walk(start)


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
                host.load_all(directory)
                settings = _settings()
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
