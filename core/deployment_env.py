"""Deployment settings the browser set-up page and the console's secrets page keep in the data dir
(`deployment.env`): the models' API keys, the adapter tokens, and the host and origin the operator used
(core.hosts); an operator may add ALLOWED_HOSTS there too. They are read like environment variables, and
the real environment always wins.

Only these names are read from the file (a line naming anything else is ignored): KEYS and the variables
the config may name as a model's key (llm_key_variables). It is written atomically
with mode 0600, and its values never appear in a page or a log.

Live secrets: every process (the web server, where the planner and the adapter gateway run, and the
cluster) applies a changed file by itself, without a restart: `refresh()` compares the file's stat with
the one last applied (one stat per call) and, when it moved, puts the secrets it holds (LIVE_KEYS and the
model key variables) into os.environ again and re-reads the adapter tokens into
settings.MAIBOT_ADAPTER_TOKENS. The model calls (core.config.BotConfig.llm_models) and the gateway's
admission (chat.gateway.auth) call it before they read a key, so a key changed in the console or by hand is
used from the next call on. A name set in the real environment when the process started is never touched.

Retired secrets: every secret value this process has held (the model keys and adapter tokens in os.environ
at start and before each refresh replaced them, each version of the file it read) is remembered, in memory
only (`held`), never written anywhere: core.redaction keeps hiding a key or token replaced live wherever the
config still holds it, for the life of the process.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

FILE_NAME = "deployment.env"
KEYS = ("OPENAI_API_KEY", "MAIBOT_ADAPTER_TOKENS", "MAIBOT_SETUP_HOST", "MAIBOT_SETUP_ORIGIN", "ALLOWED_HOSTS")
ADAPTER_TOKENS = "MAIBOT_ADAPTER_TOKENS"
MAX_VALUE_LENGTH = 4096

# Names the real environment set before the file was first read: the file never changes them.
_from_environment: set[str] = set()
# Names this process took from the file at start (a child process must read the file itself: real_environ).
_from_file: set[str] = set()
_applied_stat: tuple | None = None
_refresh_lock = threading.Lock()
# Every secret value this process has held (see the module's docstring): in memory only.
_held: set[str] = set()
_held_lock = threading.Lock()


def llm_key_variables() -> set[str]:
    """Environment variables the config may name as the LLM API key (set by the deployment).

    Standard library only: the settings module calls it while it is being imported, and anything that
    reads Django's settings then (gettext at a config module's import) would install a half-read copy of
    them, hiding a start-up error raised later in the settings module."""
    extra = os.environ.get("MAIBOT_LLM_KEY_ENVS", "")
    return {"OPENAI_API_KEY", *(name.strip() for name in extra.split(",") if name.strip())}


def names() -> set[str]:
    """The names the file may hold: KEYS and the model key variables the deployment allows."""
    return {*KEYS, *llm_key_variables()}


def _live_names() -> set[str]:
    return {ADAPTER_TOKENS, *llm_key_variables()}


def read(path: Path) -> dict[str, str]:
    """The file's allowed `NAME=value` lines (missing file: none)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    allowed = names()
    values = {}
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and name.strip() in allowed:
            values[name.strip()] = value.strip()
    return values


def remember(values: Iterable[str]) -> None:
    """Keep `values` (secrets this process holds) among those it has held, for the life of the process."""
    with _held_lock:
        _held.update(value for value in values if value)


def held() -> frozenset[str]:
    """Every secret value this process has held since it started (raw: `platform:token,...` as set)."""
    with _held_lock:
        return frozenset(_held)


def _stat(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def load_into_environ(path: Path) -> None:
    """Put the file's values in os.environ where the environment does not set them already (at start)."""
    global _applied_stat
    # An empty variable counts as unset (as the set-up and the console write it: absent).
    _from_environment.update(name for name in names() if os.environ.get(name))
    _applied_stat = _stat(path)
    values = read(path)
    for name, value in values.items():
        if not os.environ.get(name):
            os.environ[name] = value
            _from_file.add(name)
    remember([*values.values(), *(os.environ.get(name, "") for name in _live_names())])


def real_environ() -> dict[str, str]:
    """os.environ without what load_into_environ took from the file: the environment to start a child
    process with, which reads the file itself (else the file's values at this start would pass for the
    real environment's there, and a later change of the file would never reach it)."""
    return {name: value for name, value in os.environ.items() if name not in _from_file}


def from_environment(name: str) -> bool:
    """Whether the real environment sets `name` (then the file, and so the console, cannot change it)."""
    return name in _from_environment


def default_path() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / FILE_NAME


def refresh(path: Path | None = None) -> bool:
    """Apply the file's secrets to this process if the file changed since they were last applied (see
    the module's docstring). Returns whether it applied anything."""
    global _applied_stat
    path = path or default_path()
    current = _stat(path)
    if current == _applied_stat:
        return False
    with _refresh_lock:
        if current == _applied_stat:
            return False
        values = read(path)
        # What this replaces stays a secret (core.redaction), as what it applies.
        remember([*values.values(), *(os.environ.get(name, "") for name in _live_names())])
        for name in _live_names() - _from_environment:
            if values.get(name):
                os.environ[name] = values[name]
                _from_file.add(name)
            else:
                os.environ.pop(name, None)
                _from_file.discard(name)
        _applied_stat = current
        _apply_adapter_tokens()
    logger.info("%s changed: its secrets are applied to this process", FILE_NAME)
    return True


def _apply_adapter_tokens() -> None:
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    from core.adapter_tokens import parse_adapter_tokens

    try:
        tokens = parse_adapter_tokens(os.environ.get(ADAPTER_TOKENS, ""), name=ADAPTER_TOKENS)
    except ImproperlyConfigured as exc:  # a hand edit gone wrong: the tokens in force stay
        logger.error("%s in %s is not applied, the tokens in force stay: %s", ADAPTER_TOKENS, FILE_NAME, exc)
        return
    settings.MAIBOT_ADAPTER_TOKENS = tokens


def update(path: Path, values: dict[str, str]) -> None:
    """Merge `values` into the file (an empty value removes the name), atomically, mode 0600."""
    allowed = names()
    for name, value in values.items():
        if name not in allowed:
            raise ValueError(f"{name} is not kept in {FILE_NAME}")
        if len(value) > MAX_VALUE_LENGTH or "\n" in value or "\r" in value:
            raise ValueError(f"{name}: at most {MAX_VALUE_LENGTH} characters on one line")
    merged = {**read(path), **values}
    text = "".join(f"{name}={value}\n" for name, value in merged.items() if value)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".deployment-")  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
