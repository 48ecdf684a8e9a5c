"""The plugin folder watcher: a thread following the plugins directory (watchfiles, like the bot
config's watcher) that tells the host which plugin folders changed, appeared or went."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from plugins import manifest as mf
from plugins.host_base import CONFIG_FILE, ReloadOutcome, text_digest
from plugins.records import PluginState, now_iso
from plugins.reloading import PluginReloading

logger = logging.getLogger("plugins.host")


class PluginWatcher:
    """Follows the plugins directory (watchfiles, like the bot config's watcher). A plugin whose folder
    is removed is unloaded, always. With `hot_reload`, a plugin is reloaded when one of its files or
    its config.toml changes, and a new folder is loaded. Our own config writes are recognised by their
    digest and skipped; a plugin with `allow_hot_reload = false` is not reloaded (reload it from the
    admin)."""

    def __init__(self, host: PluginReloading, directory: Path, *, debounce_ms: int, hot_reload: bool = True) -> None:
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
