"""Loading bot_config.toml and the one object everything reads it through (`get_config()`): parsed
whole or not at all, swapped atomically on reload, the old config kept on error."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomlkit
from django.utils.translation import gettext, gettext_noop
from pydantic import ValidationError

from core.config.base import ConfigError
from core.config.model import BotConfig
from core.config.template import render_template

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "config" / "bot_config.toml"
logger = logging.getLogger(__name__)


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(file)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{key}: {msg}")
    return "; ".join(lines)


# Keys of earlier versions that are no longer bot config (whoever may edit the config must not choose
# what pip installs or from where): a file that still has them loads, they are ignored and a warning
# says where the setting went, rather than the file failing as "unknown key".
RETIRED_KEYS = {
    ("plugins", "pip_args"): gettext_noop(
        "the package index is a deployment setting now: MAIBOT_PIP_INDEX_URL, MAIBOT_PIP_EXTRA_INDEX_URL"
    ),
    ("plugins", "auto_install_dependencies"): gettext_noop(
        "automatic installs are a deployment setting now: MAIBOT_PLUGIN_AUTO_INSTALL=1"
    ),
}
RETIRED_SENTENCE = gettext_noop("%(key)s is no longer a bot config setting and is ignored (%(where)s)")
_warned_retired: set[tuple[str, str]] = set()


def retired_keys(data: dict[str, Any], translate=gettext) -> list[str]:
    """What the parsed file `data` still holds of RETIRED_KEYS, each as a sentence saying where it went
    (in the active language; `translate=str` for the log)."""
    sentence = translate(RETIRED_SENTENCE)
    return [
        sentence % {"key": f"{section}.{key}", "where": translate(where)}
        for (section, key), where in RETIRED_KEYS.items()
        if isinstance(data.get(section), dict) and key in data[section]
    ]


def _without_retired(data: dict[str, Any]) -> dict[str, Any]:
    for section, key in RETIRED_KEYS:
        if isinstance(data.get(section), dict) and key in data[section]:
            if (section, key) not in _warned_retired:  # once per process, not at every reload
                _warned_retired.add((section, key))
                logger.warning("bot_config.toml: %s", retired_keys({section: {key: None}}, translate=str)[0])
            data[section] = {k: v for k, v in data[section].items() if k != key}
    return data


def parse_config(text: str, source: str = "bot_config.toml") -> BotConfig:
    """Parse and validate TOML text. Raises ConfigError naming the key and the problem."""
    try:
        data = tomlkit.parse(text).unwrap()
    except Exception as exc:  # tomlkit raises several ParseError subclasses
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    data = _without_retired(data)
    try:
        return BotConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_format_errors(exc)}") from exc


def config_path() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "bot_config.toml"


def ensure_config_file(path: Path | None = None) -> Path:
    """Create the live config from the template on first run; never overwrite an existing one."""
    path = path or config_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        text = TEMPLATE_PATH.read_text(encoding="utf-8") if TEMPLATE_PATH.exists() else render_template()
        # Write aside, then link into place: the file appears whole or not at all, and a
        # concurrent first start never overwrites what another process created.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)  # a leftover of a crashed start with the same pid
        private_write(tmp, text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    return path


def private_write(path: Path, text: str) -> None:
    """Write `text` to a new file `path`, mode 0600 whatever the umask (the data dir is private)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def load_config(path: Path | None = None) -> BotConfig:
    path = ensure_config_file(path)
    return parse_config(path.read_text(encoding="utf-8"), source=str(path))


_lock = threading.RLock()
_current: BotConfig | None = None


def get_config() -> BotConfig:
    """The bot configuration in force. Loaded on first use; swapped atomically on reload."""
    global _current
    cfg = _current
    if cfg is None:
        with _lock:
            if _current is None:
                _current = load_config()
            cfg = _current
    return cfg


def set_config(cfg: BotConfig) -> None:
    global _current
    with _lock:
        _current = cfg


def reload_config() -> BotConfig:
    """Re-read the file; on error the old config stays in force and ConfigError is raised."""
    cfg = load_config()
    set_config(cfg)
    return cfg


@contextlib.contextmanager
def override(**sections: dict[str, Any]) -> Iterator[BotConfig]:
    """Temporarily replace config values in this process: override(scheduling={"max_attempts": 2})."""
    old = get_config()
    data = old.model_dump()
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    set_config(BotConfig.model_validate(data))
    try:
        yield get_config()
    finally:
        set_config(old)
