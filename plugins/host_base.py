"""What the plugin host's parts (plugins.host and the modules it is made of) share: its time limits, a
plugin's config file, its errors and outcomes, and small helpers."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugins.records import ComponentInfo

# Seconds a plugin's on_unload may take when its runner stops.
UNLOAD_TIMEOUT = 10.0
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


def plugin_settings():
    """The [plugins] section of the bot config in force."""
    from core.config import get_config

    return get_config().plugins


async def gather(*coros: Coroutine, return_exceptions: bool = False) -> list[Any]:
    return await asyncio.gather(*coros, return_exceptions=return_exceptions)


def read_config(path: Path) -> str | None:
    """A plugin's config.toml as the host sends it to the runner; None when there is none."""
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"config.toml is larger than {MAX_CONFIG_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def describe(component: ComponentInfo) -> str:
    return f"{component.kind} {component.name}" + ("" if component.registered else f" (skipped: {component.note})")
