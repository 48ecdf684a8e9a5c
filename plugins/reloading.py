"""Changing a running plugin, part of the plugin host (mixed into plugins.host.PluginHost): reload it
(file change, config edit, admin action), enable or disable it, install its dependencies, load a folder
that appeared and unload one that went. A reload starts the new version in a new runner first; only when
it loaded is it swapped in, so a failed reload keeps the previous version running and shows why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from plugins import deps
from plugins.host_base import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    UNLOAD_TIMEOUT,
    ReloadOutcome,
    plugin_settings,
    write_atomic,
)
from plugins.loading import raw_id
from plugins.manifest import MANIFEST_FILE
from plugins.records import PluginRecord, PluginState, now_iso

logger = logging.getLogger("plugins.host")


class PluginReloading:
    """The reloading part of PluginHost (see plugins.host for the state it uses)."""

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
                    outcome = self.run(self._start_runner(record, config_text), plugin_settings().load_timeout * 2 + 10)
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
                write_atomic(record.folder / CONFIG_FILE, config_text)
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
            plugin_id = raw_id(folder)
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

    def rescan(self) -> list[ReloadOutcome]:
        """Look at the plugins folder again (the console's Rescan; what the watcher does on its own): unload
        the plugins whose folders went, load the folders that appeared (with a _manifest.json)."""
        outcomes = self.unload_removed()
        if self.directory is None or not self.directory.is_dir():
            return outcomes
        for folder in sorted(p for p in self.directory.iterdir() if p.is_dir()):
            if folder.name.startswith((".", "_")) or folder.name.casefold() in ("data", "__pycache__"):
                continue
            if self.record_for_path(folder)[1] is None and (folder / MANIFEST_FILE).is_file():
                outcomes.append(self.add_folder(folder))
        return outcomes

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
