"""Hot reload of bot_config.toml: the file watcher, the validate → swap path, and the reload callbacks.

Every change, whether the file was edited by hand (the watcher sees it) or saved from the console
editor, goes through one path under one lock: parse and validate; on failure keep the config in force
and remember the error (the admin shows it in a banner); on success swap it in and run the registered
callbacks in priority order (lower number first), each isolated so one failing callback does not stop
the rest. The editor writes the file atomically and records the text it applied, so the watcher that
then sees the write finds nothing new: one save, one round of callbacks.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core import config as bot_config
from core.config import BotConfig, ConfigError

logger = logging.getLogger(__name__)

ReloadCallback = Callable[[BotConfig, BotConfig], Any]


@dataclass(order=True)
class _Registration:
    priority: int
    seq: int
    name: str = field(compare=False)
    func: ReloadCallback = field(compare=False)


@dataclass
class ReloadResult:
    """What one reload attempt did; the last failed one is shown in the admin banner."""

    ok: bool
    at: datetime
    source: str  # the file path, or "console editor"
    changed_keys: list[str] = field(default_factory=list)
    error: str = ""
    callback_errors: list[str] = field(default_factory=list)


_registrations: list[_Registration] = []
_seq = itertools.count()
_registry_lock = threading.Lock()
# Serialises whole reloads (read → validate → swap → callbacks), not only the swap.
_reload_lock = threading.RLock()
_applied_digest: str | None = None
last_result: ReloadResult | None = None
last_error: ReloadResult | None = None


def register_reload_callback(func: ReloadCallback, *, priority: int = 100, name: str | None = None) -> ReloadCallback:
    """Run `func(new_config, old_config)` after every reload that changed the config.

    Lower priority numbers run first (foundations before what builds on them); callbacks of equal
    priority run in registration order, and coroutine functions of equal priority run concurrently.
    Registering the same function again replaces its registration.
    """
    with _registry_lock:
        _registrations[:] = [r for r in _registrations if r.func is not func]
        _registrations.append(
            _Registration(priority, next(_seq), name or getattr(func, "__qualname__", repr(func)), func)
        )
        _registrations.sort()
    return func


def unregister_reload_callback(func: ReloadCallback) -> None:
    with _registry_lock:
        _registrations[:] = [r for r in _registrations if r.func is not func]


def run_reload_callbacks(new: BotConfig, old: BotConfig) -> list[str]:
    """Run every callback in priority order; returns the errors ("name: message") of those that failed."""
    with _registry_lock:
        regs = list(_registrations)
    errors: list[str] = []
    for _, group in itertools.groupby(regs, key=lambda r: r.priority):
        pending: list[tuple[_Registration, Any]] = []
        for reg in group:
            try:
                result = reg.func(new, old)
            except Exception as exc:
                logger.exception("config reload callback %s failed", reg.name)
                errors.append(f"{reg.name}: {exc}")
                continue
            if inspect.isawaitable(result):
                pending.append((reg, result))
        if pending:
            # Reloads run in plain threads (the watcher, a sync admin view): no loop is running here.
            async def gather(awaitables=tuple(a for _, a in pending)):
                return await asyncio.gather(*awaitables, return_exceptions=True)

            try:
                outcomes = asyncio.run(gather())
            except RuntimeError as exc:  # called from a running loop: a caller bug, not a config one
                for _, awaitable in pending:
                    getattr(awaitable, "close", lambda: None)()
                outcomes = [exc] * len(pending)
            for (reg, _), outcome in zip(pending, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    logger.error("config reload callback %s failed: %r", reg.name, outcome)
                    errors.append(f"{reg.name}: {outcome}")
    return errors


def text_digest(text: str) -> str:
    """A digest of the config text, keyed with SECRET_KEY: the editor's page carries it, and a plain hash
    of a text whose only unknown is a short secret would let the page's reader guess that secret."""
    from django.utils.crypto import salted_hmac

    return salted_hmac("core.reload.text_digest", text, algorithm="sha256").hexdigest()


class ConfigChanged(ConfigError):
    """The file changed on disk after the text being saved was based on it."""


def _changed_keys(new: BotConfig, old: BotConfig) -> list[str]:
    a, b = old.model_dump(), new.model_dump()
    return [f"{section}.{key}" for section in b for key in b[section] if a.get(section, {}).get(key) != b[section][key]]


def _record(result: ReloadResult) -> ReloadResult:
    global last_result, last_error
    # last_error first: whoever sees this reload's last_result sees its last_error too.
    last_error = None if result.ok else result
    last_result = result
    return result


def _apply(cfg: BotConfig, text: str, source: str) -> ReloadResult:
    """Swap in a validated config and run the callbacks when it differs. Caller holds _reload_lock."""
    global _applied_digest
    _applied_digest = text_digest(text)
    old = bot_config.get_config()
    changed = _changed_keys(cfg, old)
    if not changed:
        logger.info("bot config from %s is unchanged; nothing to reload", source)
        return _record(ReloadResult(ok=True, at=datetime.now(UTC), source=source))
    bot_config.set_config(cfg)
    logger.info("bot config reloaded from %s; changed: %s", source, ", ".join(changed))
    errors = run_reload_callbacks(cfg, old)
    return _record(
        ReloadResult(ok=True, at=datetime.now(UTC), source=source, changed_keys=changed, callback_errors=errors)
    )


def reload_from_file(path: Path | None = None) -> ReloadResult | None:
    """Re-read the config file and apply it. Returns None when the text is what was last applied
    (e.g. the watcher seeing the editor's own write); on an invalid file the old config stays."""
    global _applied_digest
    path = path or bot_config.config_path()
    with _reload_lock:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            logger.error("bot config %s cannot be read: %s; keeping the config in force", path, exc)
            return _record(ReloadResult(ok=False, at=datetime.now(UTC), source=str(path), error=str(exc)))
        if text_digest(text) == _applied_digest:
            return None
        try:
            cfg = bot_config.parse_config(text, source=str(path))
        except ConfigError as exc:
            _applied_digest = text_digest(text)  # report a broken text once, not on every touch
            logger.error("bot config reload rejected, keeping the config in force: %s", exc)
            return _record(ReloadResult(ok=False, at=datetime.now(UTC), source=str(path), error=str(exc)))
        return _apply(cfg, text, str(path))


# Keys that choose where the model calls (and the API key) go: changing them needs its own permission.
PROVIDER_KEYS = ("llm.base_url", "llm.api_key_env")
# The MCP servers: programs this machine runs and URLs (with headers) it calls, so a permission of their own.
MCP_KEYS = ("mcp.servers",)


def _model_providers(cfg: BotConfig) -> list[tuple[str, str, str]]:
    return [(m.name, m.base_url, m.api_key_env) for m in cfg.llm.models]


def provider_changes(new: BotConfig, old: BotConfig) -> list[str]:
    """The provider keys a change touches: llm.base_url, llm.api_key_env, and a [[llm.models]] entry's
    base_url or api_key_env (or a model added or removed, which brings its own)."""
    keys = [k for k in _changed_keys(new, old) if k in PROVIDER_KEYS]
    if _model_providers(new) != _model_providers(old):
        keys.append("llm.models")
    return keys


def config_save_text(
    *,
    text: str,
    path: Path | None = None,
    source: str = "console editor",
    expected_digest: str | None = None,
    user: Any = None,
    may_change_provider: bool = True,
    may_change_mcp: bool = True,
) -> ReloadResult:
    """Validate TOML text, write it as the config file (atomically), apply it and record who changed
    what. Raises ConfigError (nothing written, nothing changed) when the text is not a valid config or
    changes a provider key without `may_change_provider` (an MCP key without `may_change_mcp`), and
    ConfigChanged when `expected_digest` is given and the file no longer has that content."""
    path = path or bot_config.config_path()
    with _reload_lock:
        cfg = bot_config.parse_config(text, source="bot_config.toml")
        old = bot_config.get_config()
        changed = _changed_keys(cfg, old)
        provider = provider_changes(cfg, old)
        if provider and not may_change_provider:
            raise ConfigError(
                f"{', '.join(provider)}: changing the model provider needs the permission "
                "'Can change the model provider'; nothing was saved"
            )
        if not may_change_mcp and any(k in MCP_KEYS for k in changed):
            raise ConfigError(
                "mcp.servers: changing the MCP servers needs the permission 'Can change the MCP servers'; "
                "nothing was saved"
            )
        if expected_digest is not None:
            try:
                current = text_digest(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                current = ""
            if current != expected_digest:
                raise ConfigChanged(
                    "bot_config.toml changed on disk since this page was loaded; nothing was saved. "
                    "Review the current file and save again."
                )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.unlink(missing_ok=True)  # a leftover of a crashed save
            bot_config.private_write(tmp, text)  # 0600: the replaced file's mode is not carried over
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        result = _apply(cfg, text, source)
        if result.changed_keys:
            _history_record(result, old=old, new=cfg, user=user)
        return result


def _history_record(result: ReloadResult, *, old: BotConfig, new: BotConfig, user: Any) -> None:
    from core.models import ConfigChange

    def value(cfg: BotConfig, key: str) -> Any:
        section, name = key.split(".")
        return getattr(getattr(cfg, section), name)

    watched = [k for k in (*PROVIDER_KEYS, "llm.model") if k in result.changed_keys]
    provider = {k: [value(old, k), value(new, k)] for k in watched}
    if _model_providers(old) != _model_providers(new):
        provider["llm.models"] = [_model_providers(old), _model_providers(new)]
    ConfigChange.objects.create(
        user=user if getattr(user, "pk", None) else None,
        source=result.source[:64],
        changed_keys=result.changed_keys,
        provider=provider,
    )


# --- the watcher ----------------------------------------------------------------------------------


def watch_files(
    directory: Path,
    *,
    what: str,
    watch_filter: Callable[[Any, str], bool],
    debounce_ms: int,
    stop_event: threading.Event,
    ready: threading.Event,
    on_changes: Callable[[set[Path]], Any],
    recursive: bool = True,
) -> None:
    """Watch `directory` (watchfiles) until `stop_event` is set, calling `on_changes` with each burst of
    changed paths; `ready` is set once watching (and when the watch ends). A failing `on_changes` is
    logged and the watch goes on. The bot config's watcher and the plugin watcher run on it."""
    import watchfiles

    logger.info("watching %s for changes to %s", directory, what)
    try:
        for changes in watchfiles.watch(
            directory,
            watch_filter=watch_filter,
            # `step`: wait this long for more changes before yielding; `debounce`: the hard cap.
            step=debounce_ms,
            debounce=max(debounce_ms * 10, 1600),
            stop_event=stop_event,
            rust_timeout=200,  # also how soon the starter knows it is watching
            yield_on_timeout=True,
            raise_interrupt=False,
            recursive=recursive,
        ):
            ready.set()
            if not changes:
                continue  # the periodic timeout: lets the loop notice stop_event
            try:
                on_changes({Path(p) for _, p in changes})
            except Exception:
                logger.exception("handling changes to %s failed", what)
    except Exception:
        logger.exception("the watcher of %s stopped", what)
    finally:
        ready.set()


class ConfigWatcher:
    """Watches the config file (through its directory, so atomic replaces are seen) in a thread and
    reloads once the file has been quiet for `debounce_ms`: a burst of writes is one reload."""

    def __init__(self, path: Path | None = None, *, debounce_ms: int | None = None) -> None:
        self.path = (path or bot_config.config_path()).resolve()
        self.debounce_ms = debounce_ms or bot_config.get_config().console.reload_debounce_ms
        self.reloads = 0  # reload attempts made (not counting no-op re-reads)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def _is_config(self, change: Any, changed_path: str) -> bool:
        return Path(changed_path).name == self.path.name

    def start(self) -> ConfigWatcher:
        # The config in force was loaded at start-up; the file may have changed since (the server
        # starts its watcher on the first request). Catch up once, then follow changes.
        reload_from_file(self.path)
        self._thread = threading.Thread(target=self._run, name="maibot-config-watcher", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        def reload(_paths: set[Path]) -> None:
            if reload_from_file(self.path) is not None:
                self.reloads += 1

        watch_files(
            self.path.parent,
            what=f"config {self.path}",
            watch_filter=self._is_config,
            debounce_ms=self.debounce_ms,
            stop_event=self._stop,
            ready=self._ready,
            on_changes=reload,
            recursive=False,
        )

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
