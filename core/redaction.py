"""Secrets in the bot config, hidden from those who read the config without needing them: the console's
config editors (a user with `change_config` only) and plugins (`config.get`).

What is secret:
- a value at a secret place of the config: each value of an MCP server's `headers` and `env` (a
  `${NAME}` reference is not a secret, only the name of one), however short;
- every value of the deployment's secrets: the model API keys (OPENAI_API_KEY and the variables
  MAIBOT_LLM_KEY_ENVS lists), the MCP secret variables (MAIBOT_MCP_SECRET_ENVS), the adapter tokens,
  what deployment.env holds, SECRET_KEY, DJANGO_SUPERUSER_PASSWORD, the database's and Redis's
  passwords; the password of a URL's `user:password@` in the config; and the values of the secret
  places above, wherever else they appear;
- every value those deployment secrets had in this process since it started: a model key or an adapter
  token replaced live (the console's connect page, a hand edit of deployment.env applied by
  deployment_env.refresh) stays a secret for the life of the process, kept in memory only
  (deployment_env.held), so the config's text that still holds the old value never shows it.

Redaction is by value: every occurrence of a secret (of at least MIN_SECRET_LENGTH characters; a shorter
one only at its own place) is replaced wherever it is, under any key, inside lists and tables, and in
the file's comments. The editors show `<redacted:TAG>`, TAG a digest of the secret keyed with
SECRET_KEY (it tells two secrets apart and nothing about them); plugins see `<redacted>`.

Saving an editor's text restores a placeholder only where that secret was: at the same place (table
key, array index, or for an array of tables the entry of the same `name`) of the file as it is, or in a
comment. A placeholder anywhere else is refused, and so is one in a key: copied elsewhere it would put a
secret the editor cannot read where it can be read (a nickname, a persona...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tomlkit

from core import deployment_env
from core.config import ConfigError, llm_key_variables, mcp_secret_variables

MIN_SECRET_LENGTH = 8
PLUGIN_PLACEHOLDER = "<redacted>"
PLACEHOLDER = re.compile(r"<redacted:([0-9a-f]{12})>")
_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")

KeyPath = tuple[Any, ...]  # keys and array positions from the top of the config


def deployment_secret_values() -> set[str]:
    """The values of the deployment's secrets (see the module docstring): those in force and every one this
    process held before."""
    from django.conf import settings

    names = {*llm_key_variables(), *mcp_secret_variables(), "MAIBOT_ADAPTER_TOKENS", "DJANGO_SUPERUSER_PASSWORD"}
    current = {os.environ.get(name, "") for name in names}
    current |= set(deployment_env.read(Path(settings.DATA_DIR) / deployment_env.FILE_NAME).values())
    deployment_env.remember(current)
    values = set(deployment_env.held())
    for tokens in list(values):
        for item in tokens.split(","):  # `token` or `platform:token`, comma-separated
            values |= {item.strip(), item.split(":", 1)[-1].strip()}
    values.add(settings.SECRET_KEY)
    values.add(settings.DATABASES["default"].get("PASSWORD") or "")
    if settings.REDIS_URL:
        values.add(urlsplit(settings.REDIS_URL).password or "")
    return {v for v in values if v}


def _secret_place(path: KeyPath) -> bool:
    # mcp.servers[i].headers.<name> and mcp.servers[i].env.<NAME>
    return len(path) == 5 and path[0] == "mcp" and path[1] == "servers" and path[3] in ("headers", "env")


def _is_secret_value(path: KeyPath, value: Any) -> bool:
    return _secret_place(path) and isinstance(value, str) and bool(value) and not _REFERENCE.match(value)


def _walk(node: Any, path: KeyPath, visit: Callable[[KeyPath, Any], None]) -> None:
    """Call visit(path, value) on every leaf of plain data or a tomlkit document."""
    if isinstance(node, Mapping):
        for key, value in list(node.items()):
            _walk(value, (*path, str(key)), visit)
    elif isinstance(node, list | MutableSequence) and not isinstance(node, str):
        for index, value in enumerate(list(node)):
            _walk(value, (*path, index), visit)
    else:
        visit(path, node)


@dataclass(frozen=True)
class Secrets:
    """The secrets of one config (its secret places) and of the deployment, and how they are shown."""

    values: tuple[str, ...]  # replaced wherever they occur, longest first

    @classmethod
    def of(cls, *configs: Any) -> Secrets:
        """The deployment's secrets and those of each config (plain data, e.g. the parsed file and the
        config in force)."""
        found = deployment_secret_values()

        def collect(path: KeyPath, value: Any) -> None:
            if _is_secret_value(path, value):
                found.add(str(value))
            elif path[-1:] == ("url",) and isinstance(value, str):  # https://user:password@host/
                try:
                    found.add(urlsplit(value).password or "")
                except ValueError:
                    pass

        for data in configs:
            _walk(data, (), collect)
        return cls(tuple(sorted((v for v in found if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)))

    @staticmethod
    def tag(secret: str) -> str:
        from django.utils.crypto import salted_hmac

        return salted_hmac("core.redaction", secret, algorithm="sha256").hexdigest()[:12]

    def placeholder(self, secret: str, *, tagged: bool) -> str:
        return f"<redacted:{self.tag(secret)}>" if tagged else PLUGIN_PLACEHOLDER

    def redact_text(self, text: str, *, tagged: bool = True) -> str:
        for secret in self.values:
            if secret in text:
                text = text.replace(secret, self.placeholder(secret, tagged=tagged))
        return text

    def redact_value(self, path: KeyPath, value: Any, *, tagged: bool) -> Any:
        if _is_secret_value(path, value):
            return self.placeholder(value, tagged=tagged)
        return self.redact_text(value, tagged=tagged) if isinstance(value, str) else value

    def within(self, path: KeyPath, value: Any) -> dict[str, str]:
        """The secrets `value` (at `path`) holds, by tag: what a placeholder there may stand for."""
        if not isinstance(value, str):
            return {}
        held = {self.tag(s): s for s in self.values if s in value}
        if _is_secret_value(path, value):
            held[self.tag(value)] = value
        return held


# --- plain data: config.get, the console's form ---------------------------------------------------------


def redact_data(data: Any, secrets: Secrets, *, tagged: bool, path: KeyPath = ()) -> Any:
    """A copy of plain data (dicts, lists, scalars) with every secret replaced, in keys too."""
    if isinstance(data, Mapping):
        return {
            secrets.redact_text(str(k), tagged=tagged): redact_data(v, secrets, tagged=tagged, path=(*path, str(k)))
            for k, v in data.items()
        }
    if isinstance(data, list | tuple):
        return [redact_data(v, secrets, tagged=tagged, path=(*path, i)) for i, v in enumerate(data)]
    return secrets.redact_value(path, data, tagged=tagged)


def restore_data(new: Any, old: Any, secrets: Secrets, *, path: KeyPath = ()) -> Any:
    """`new` (an edit of the redacted `old`) with each placeholder given back the secret `old` held at the
    same place. ConfigError names the place of a placeholder that stands for nothing there."""
    if isinstance(new, Mapping):
        olds = old if isinstance(old, Mapping) else {}
        restored = {}
        for key, value in new.items():
            if PLACEHOLDER.search(str(key)):
                raise ConfigError(_refused((*path, key), in_key=True))
            restored[key] = restore_data(value, olds.get(key), secrets, path=(*path, str(key)))
        return restored
    if isinstance(new, list | tuple):
        return [restore_data(v, _paired(old, i, v), secrets, path=(*path, i)) for i, v in enumerate(new)]
    if isinstance(new, str):
        return _restore_text(new, secrets.within(path, old), path)
    return new


def _paired(old: Any, index: int, new_item: Any) -> Any:
    """The entry of the old array that `new_item` edits: the one of the same `name` (arrays of tables,
    e.g. [[mcp.servers]], whose entries may be reordered), else the one at the same index."""
    if not isinstance(old, list | MutableSequence) or isinstance(old, str):
        return None
    name = new_item.get("name") if isinstance(new_item, Mapping) else None
    if isinstance(name, str):
        for item in old:
            if isinstance(item, Mapping) and item.get("name") == name:
                return item
    return old[index] if index < len(old) else None


def _restore_text(text: str, held: dict[str, str], path: KeyPath) -> str:
    def replace(match: re.Match) -> str:
        if match[1] not in held:
            raise ConfigError(_refused(path))
        return held[match[1]]

    return PLACEHOLDER.sub(replace, text)


def _refused(path: KeyPath, *, in_key: bool = False) -> str:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(file)"
    if in_key:
        return f"{where}: a key holds a redacted value; type the key in full. Nothing was saved."
    return (
        f"{where}: a redacted value can only stay where it was; type the value in full here "
        "(or move it back). Nothing was saved."
    )


# --- the TOML text: the raw editor ---------------------------------------------------------------------


def redact_toml(text: str, secrets: Secrets) -> str:
    """The config file's text with every secret replaced by its placeholder, layout and comments kept."""
    try:
        document = tomlkit.parse(text)
    except Exception:  # a broken file is shown to be fixed: by value only
        return secrets.redact_text(text)

    def visit(path: KeyPath, value: Any, container: Any, key: Any) -> None:
        redacted = secrets.redact_value(path, value, tagged=True)
        if redacted != value:
            container[key] = redacted

    _walk_items(document, (), visit)
    return secrets.redact_text(tomlkit.dumps(document))  # comments, keys


def restore_toml(new_text: str, old_text: str, secrets: Secrets) -> str:
    """The edited text with its placeholders given back their secrets (see the module docstring). A text
    that is not TOML is returned as it is (saving it fails on that). ConfigError: a misplaced one."""
    if not PLACEHOLDER.search(new_text):
        return new_text
    try:
        document = tomlkit.parse(new_text)
    except Exception:
        return new_text
    try:
        old = tomlkit.parse(old_text).unwrap()
    except Exception:
        old = {}

    _restore_items(document, old, (), secrets)
    text = tomlkit.dumps(document)
    # What is left is in comments, where nothing reads it: given back when the file had that secret.
    return PLACEHOLDER.sub(lambda m: _secret_in(old_text, m[1], secrets) or m[0], text)


def _restore_items(node: Any, old: Any, path: KeyPath, secrets: Secrets) -> None:
    """Give the placeholders of a tomlkit container back their secrets, walking `old` (plain data, the
    file as it is) alongside."""
    if isinstance(node, MutableMapping):
        entries = [(key, value, old.get(str(key)) if isinstance(old, Mapping) else None) for key, value in node.items()]
    else:
        entries = [(index, value, _paired(old, index, value)) for index, value in enumerate(node)]
    for key, value, was in entries:
        here = (*path, str(key) if isinstance(node, MutableMapping) else key)
        if PLACEHOLDER.search(str(key)) and isinstance(node, MutableMapping):
            raise ConfigError(_refused(here, in_key=True))
        if _is_container(value):
            _restore_items(value, was, here, secrets)
        elif isinstance(value, str) and PLACEHOLDER.search(value):
            node[key] = _restore_text(str(value), secrets.within(here, was), here)


def _secret_in(text: str, tag: str, secrets: Secrets) -> str | None:
    return next((s for s in secrets.values if secrets.tag(s) == tag and s in text), None)


def _walk_items(node: Any, path: KeyPath, visit: Callable[[KeyPath, Any, Any, Any], None]) -> None:
    """visit(path, value, container, key) for each scalar of a tomlkit document (the container may be
    assigned to)."""
    if isinstance(node, MutableMapping):
        for key, value in list(node.items()):
            if _is_container(value):
                _walk_items(value, (*path, str(key)), visit)
            else:
                visit((*path, str(key)), value, node, key)
    elif isinstance(node, MutableSequence):
        for index, value in enumerate(list(node)):
            if _is_container(value):
                _walk_items(value, (*path, index), visit)
            else:
                visit((*path, index), value, node, index)


def _is_container(value: Any) -> bool:
    return isinstance(value, MutableMapping | MutableSequence) and not isinstance(value, str)
