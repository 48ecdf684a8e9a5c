"""The plugin host: finds the plugins in $MAIBOT_DATA_DIR/plugins/<folder>/, checks and orders them,
imports each folder as a package, creates the plugin (`create_plugin()`), gives it its PluginContext
and runs its coroutines on the host's own event loop (a thread of its own, never the ASGI server's
loop), with a timeout on every call.

Every refusal and failure is kept with its reason (`host.records`) and logged; a broken plugin never
stops the others or the process. Components become our mechanisms (plugins.bridge): tools and
actions are planner tools, commands run before the planner.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import importlib.util
import logging
import re
import sys
import threading
import tomllib
import warnings
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from plugins import bridge
from plugins import events as plugin_events
from plugins import manifest as mf
from plugins.capabilities import SUPPORTED, make_context
from plugins.records import ComponentInfo, PluginRecord, PluginState

logger = logging.getLogger(__name__)

# Seconds a plugin's on_load may take, and the default for one capability call (MaiBot's RPC default).
LOAD_TIMEOUT = 30.0
CAPABILITY_TIMEOUT = 30.0
MAX_CONFIG_BYTES = 1024 * 1024


class PluginCallTimeout(TimeoutError):
    pass


def plugins_dir() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "plugins"


def module_prefix(plugin_id: str) -> str:
    safe = re.sub(r"[^0-9A-Za-z_]", "_", plugin_id)
    return f"_maibot_plugin_{safe}"


class PluginHost:
    def __init__(self, host_version: str = mf.HOST_APPLICATION_VERSION) -> None:
        self.host_version = host_version
        self.records: dict[str, PluginRecord] = {}  # by plugin id (or folder name when it has none)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._unregister: list[Callable[[], None]] = []

    # --- the plugins' event loop --------------------------------------------------------------------

    def _start_loop(self) -> None:
        if self.loop is not None:
            return
        ready = threading.Event()

        def run() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="maibot-plugins", daemon=True)
        self._thread.start()
        ready.wait()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a plugin coroutine on the plugins' loop and wait at most `timeout` seconds (from any
        thread but that loop's). On timeout the coroutine is cancelled and PluginCallTimeout raised."""
        if self.loop is None:
            coro.close()  # never started: close it rather than leave it un-awaited
            raise RuntimeError("the plugin host is not started")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise PluginCallTimeout(f"did not finish within {timeout:g}s") from None

    def stop(self) -> None:
        for undo in reversed(self._unregister):
            try:
                undo()
            except Exception:
                logger.exception("unregistering a plugin component failed")
        self._unregister.clear()
        unloaded = 0
        for record in self.records.values():
            if record.state == PluginState.LOADED and record.instance is not None:
                self._unload(record)
                unloaded += 1
            _purge_modules(record)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self._thread is not None:
                self._thread.join(5)
            self.loop = None
        logger.info("plugins unloaded (%d)", unloaded)

    def _unload(self, record: PluginRecord) -> None:
        from maibot_sdk import MaiBotPlugin

        if type(record.instance).on_unload is MaiBotPlugin.on_unload:
            return
        try:
            self.run(record.instance.on_unload(), LOAD_TIMEOUT)
        except Exception:
            logger.exception("plugin %s: on_unload failed", record.plugin_id)

    def on_unregister(self, undo: Callable[[], None]) -> None:
        self._unregister.append(undo)

    # --- loading -----------------------------------------------------------------------------------

    def load_all(self, directory: Path | None = None) -> list[PluginRecord]:
        """Discover, check, order and load every plugin of `directory` (default: the data dir's)."""
        directory = directory or plugins_dir()
        self._start_loop()
        if not directory.is_dir():
            logger.info("no plugins directory at %s: no plugins", directory)
            return []
        candidates = self._discover(directory)
        for record in self._ordered(candidates):
            self._load(record)
        loaded = [r for r in self.records.values() if r.state == PluginState.LOADED]
        logger.info(
            "plugins loaded: %d of %d (%s)",
            len(loaded),
            len(self.records),
            ", ".join(f"{r.plugin_id or r.folder.name}={r.state}" for r in self.records.values()) or "none",
        )
        return list(self.records.values())

    def _refuse(self, record: PluginRecord, reason: str, state: PluginState = PluginState.REFUSED) -> None:
        record.state = state
        record.reason = reason
        record.error(reason)
        logger.error("plugin %s (%s) %s: %s", record.plugin_id or "?", record.folder.name, state, reason)

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
            record.unsupported_capabilities = [c for c in record.manifest.capabilities if c not in SUPPORTED]
            if record.plugin_id in candidates or record.plugin_id in self.records:
                other = candidates.pop(record.plugin_id, None) or self.records[record.plugin_id]
                why = f"the plugin id {record.plugin_id} is used by two folders: {other.folder.name}, {folder.name}"
                self._refuse(other, why)
                self.records[f"folder:{folder.name}"] = record
                self._refuse(record, why)
                continue
            self.records[record.plugin_id] = record
            try:
                record.warnings.extend(mf.check_compatibility(record.manifest, host_version=self.host_version))
            except mf.ManifestError as exc:
                self._refuse(record, str(exc))
                continue
            if missing := mf.missing_packages(record.manifest):
                self._refuse(record, "missing Python dependencies: " + ", ".join(missing))
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

    def _load(self, record: PluginRecord) -> None:
        for dep in record.manifest.plugin_dependencies:
            other = self.records.get(dep.id)
            if other is None or other.state != PluginState.LOADED:
                why = "is disabled" if other is not None and other.state == PluginState.DISABLED else "failed to load"
                self._refuse(record, f"depends on plugin {dep.id}, which {why}")
                return
        try:
            with warnings.catch_warnings(record=True) as caught:
                # The SDK warns at import about what it deprecates (e.g. @Action): shown with the plugin.
                warnings.simplefilter("always")
                module = _import_plugin(record)
            record.warnings.extend(sorted({str(w.message) for w in caught}))
            factory = getattr(module, "create_plugin", None)
            if not callable(factory):
                raise TypeError("plugin.py has no create_plugin() function")
            instance = factory()
            from maibot_sdk import MaiBotPlugin

            if not isinstance(instance, MaiBotPlugin):
                raise TypeError(f"create_plugin() returned {type(instance).__name__}, not a MaiBotPlugin")
            config = _read_config(record.folder)
            normalized, _ = instance.normalize_plugin_config(config)  # raises with the reason when invalid
            section = normalized.get("plugin")
            if isinstance(section, dict) and section.get("enabled") is False:
                _purge_modules(record)
                record.state = PluginState.DISABLED
                record.reason = "disabled in its config.toml ([plugin] enabled = false)"
                logger.info("plugin %s is disabled in its config.toml", record.plugin_id)
                return
            instance.set_plugin_config(config)
            record.instance = instance
            record.context = make_context(record)
            instance._set_context(record.context)
            if type(instance).on_load is not MaiBotPlugin.on_load:
                self.run(instance.on_load(), LOAD_TIMEOUT)
            record.components = [
                ComponentInfo(
                    name=str(c.get("name", "")),
                    type=str(c.get("type", "")),
                    handler=str(c.get("metadata", {}).get("handler_name", "")),
                    metadata=dict(c.get("metadata", {})),
                )
                for c in instance.get_components()
            ]
        except Exception as exc:
            _purge_modules(record)
            record.instance = None
            self._refuse(record, f"{type(exc).__name__}: {exc}"[:2000], PluginState.FAILED)
            logger.debug("plugin %s failed to load", record.plugin_id, exc_info=True)
            return
        record.state = PluginState.LOADED
        record.reason = ""
        bridge.register_components(self, record)
        for warning in record.warnings:
            logger.warning("plugin %s: %s", record.plugin_id, warning)
        logger.info(
            "plugin %s %s loaded: %s",
            record.plugin_id,
            record.version,
            ", ".join(_describe(c) for c in record.components) or "no components",
        )

    # --- invoking components -----------------------------------------------------------------------

    def invoke(self, record: PluginRecord, component: ComponentInfo, args: dict[str, Any], timeout: float) -> Any:
        """Call a component's handler with `args` (as MaiBot's runner does: keyword arguments)."""
        handler = getattr(record.instance, component.handler or component.name, None)
        if handler is None:
            handler = getattr(record.instance, f"handle_{component.name}", None)
        if handler is None or not callable(handler):
            raise LookupError(f"plugin {record.plugin_id} has no handler for {component.name}")
        record.calls += 1

        async def call() -> Any:
            result = handler(**args)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            return result

        try:
            return self.run(call(), timeout)
        except Exception as exc:
            record.error(f"{component.kind} {component.name}: {type(exc).__name__}: {exc}"[:500])
            raise


def _describe(component: ComponentInfo) -> str:
    return f"{component.kind} {component.name}" + ("" if component.registered else f" (skipped: {component.note})")


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


def _import_plugin(record: PluginRecord) -> Any:
    """Import the folder as a package (so `from .helpers import x` works) and return its plugin module."""
    prefix = module_prefix(record.plugin_id)
    _purge_modules(record)
    init = record.folder / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location(prefix, init, submodule_search_locations=[str(record.folder)])
    else:
        spec = importlib.machinery.ModuleSpec(prefix, None, is_package=True)
        spec.submodule_search_locations = [str(record.folder)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[prefix] = package
    if spec.loader is not None:
        spec.loader.exec_module(package)
    return importlib.import_module(f"{prefix}.plugin")


def _purge_modules(record: PluginRecord) -> None:
    if not record.plugin_id:
        return
    prefix = module_prefix(record.plugin_id)
    for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.toml"
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"config.toml is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config.toml: {exc}") from None


# The host of this process (the ASGI server's); None until started.
host: PluginHost | None = None
_lock = threading.Lock()


def start() -> PluginHost:
    """Load the data dir's plugins into this process (once)."""
    global host
    with _lock:
        if host is None:
            host = PluginHost()
            try:
                host.load_all()
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
            from maibot.process import call_before_server_shutdown

            async def unload() -> None:
                await asyncio.to_thread(stop)

            call_before_server_shutdown(asyncio.get_running_loop(), unload)
        return await app(scope, receive, send)

    return wrapper
