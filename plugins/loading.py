"""Loading the plugins of a folder, part of the plugin host (mixed into plugins.host.PluginHost, whose
state it works on): discover the plugin folders, check each (manifest, host and SDK ranges, the sandbox,
Python dependencies), order them by their dependencies (refusing those whose dependency is missing,
refused, of the wrong version or in a cycle) and start them in waves. A refusal is kept on the plugin's
record with its reason and logged."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from plugins import deps, sandbox
from plugins import manifest as mf
from plugins.capabilities import SUPPORTED
from plugins.host_base import UNLOAD_TIMEOUT, gather, plugin_settings, plugins_dir
from plugins.records import PluginRecord, PluginState

logger = logging.getLogger("plugins.host")


class PluginLoading:
    """The loading half of PluginHost (see plugins.host for the state it uses)."""

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
                    gather(*(self._start_runner(r) for r in batch), return_exceptions=True),
                    plugin_settings().load_timeout + 30,
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
            self.run(gather(*(p.stop(UNLOAD_TIMEOUT) for p in runners)), UNLOAD_TIMEOUT + 15)
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
                record.plugin_id = raw_id(folder) or ""
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


def raw_id(folder: Path) -> str | None:
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
