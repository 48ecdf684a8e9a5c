"""The deployment's secrets as the console shows and changes them: the adapter tokens (one per platform, in
MAIBOT_ADAPTER_TOKENS) and the models' API keys (the variables the config names, llm.api_key_env and each
[[llm.models]] entry's). Changes are written to deployment.env (core.deployment_env), which every process
applies by itself from its next use of the secret: no restart.

Invariants: a value is returned only by `reveal` (and by `rotate_adapter_token`, to its caller), never by
`listing`; every reveal and change is recorded in the config history (core.models.ConfigChange: who, when,
which secret), never the value; a secret the real environment sets cannot be changed here (the
environment wins over the file: the change would not apply), which is said, not silently ignored.
Callers check the permission (MANAGE_SECRETS).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.utils.translation import gettext as _

from core import deployment_env
from core.adapter_tokens import DEFAULT_PLATFORM, PLATFORM_NAME, RESERVED_PLATFORMS, parse_adapter_tokens
from core.config import get_config
from core.deployment_env import llm_key_variables

MANAGE_SECRETS = "maibot.manage_secrets"
TOKENS = deployment_env.ADAPTER_TOKENS
MAX_KEY_LENGTH = 512
# The config history's `source` of each kind of event (its changed_keys name the secret, never its value).
REVEALED, ROTATED, CHANGED = "secret revealed", "secret rotated", "secret changed"

_lock = threading.Lock()


class SecretError(ValueError):
    """A request this module refuses (unknown secret, set by the environment, a bad new value): the
    message says why and is safe to show (it never contains a secret)."""


@dataclass(frozen=True)
class Secret:
    """One secret as a page lists it: never its value."""

    id: str  # "adapter:<platform>" or "model:<VARIABLE>"
    kind: str  # "adapter" | "model"
    name: str  # the platform, or the variable
    is_set: bool
    from_environment: bool  # set by the server's environment: shown, not changed here
    used_by: tuple[str, ...] = field(default=())  # a model key: the models that use it


def _adapter_tokens() -> dict[str, str]:
    deployment_env.refresh()
    tokens = parse_adapter_tokens(os.environ.get(TOKENS, ""), name=TOKENS)
    found: dict[str, str] = {}
    for token in tokens:
        found.setdefault(token.platform, token.secret)
    return found


def _model_variables() -> dict[str, list[str]]:
    cfg = get_config()
    used: dict[str, list[str]] = {}
    if cfg.llm_model:
        used.setdefault(cfg.llm.api_key_env, []).append("default")
    for model in cfg.llm.models:
        used.setdefault(model.api_key_env, []).append(model.name)
    return used or {"OPENAI_API_KEY": []}


def listing() -> list[Secret]:
    """The adapter tokens (qq's always listed, set or not) and the model keys the config uses."""
    tokens = _adapter_tokens()
    env_tokens = deployment_env.from_environment(TOKENS)
    platforms = sorted({DEFAULT_PLATFORM, *tokens}, key=lambda p: (p != DEFAULT_PLATFORM, p))
    found = [Secret(f"adapter:{p}", "adapter", p, p in tokens, env_tokens) for p in platforms]
    for variable, models in sorted(_model_variables().items()):
        found.append(
            Secret(
                f"model:{variable}",
                "model",
                variable,
                bool(os.environ.get(variable)),
                deployment_env.from_environment(variable),
                tuple(models),
            )
        )
    return found


def _find(secret_id: str) -> Secret:
    for secret in listing():
        if secret.id == secret_id:
            return secret
    raise SecretError(_("There is no such secret."))


def _record(source: str, secret: Secret, user) -> None:
    from core.models import ConfigChange

    key = f"{TOKENS}[{secret.name}]" if secret.kind == "adapter" else secret.name
    ConfigChange.objects.create(user=user if getattr(user, "pk", None) else None, source=source, changed_keys=[key])


def reveal(secret_id: str, *, user) -> str:
    """The secret's value ("" when it is not set), recorded as revealed by `user`."""
    secret = _find(secret_id)
    value = _adapter_tokens().get(secret.name, "") if secret.kind == "adapter" else os.environ.get(secret.name, "")
    _record(REVEALED, secret, user)
    return value


@contextmanager
def _file_lock() -> Iterator[None]:
    """One change of deployment.env at a time (threads of this process, and other processes)."""
    path = deployment_env.default_path()
    with _lock, open(path.with_name(".deployment.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _changeable(secret: Secret) -> None:
    if secret.from_environment:
        raise SecretError(
            _(
                "This secret is set in the server's environment, which wins over the console: change it there "
                "and restart the server."
            )
        )


def _replace_adapter_token(platform: str, new: str | None, *, user, source: str) -> None:
    if not PLATFORM_NAME.match(platform) or platform in RESERVED_PLATFORMS:
        raise SecretError(_("There is no such secret."))
    secret = Secret(f"adapter:{platform}", "adapter", platform, True, deployment_env.from_environment(TOKENS))
    _changeable(secret)
    with _file_lock():
        path = deployment_env.default_path()
        current = parse_adapter_tokens(deployment_env.read(path).get(TOKENS, ""), name=TOKENS)
        entries = [f"{t.platform}:{t.secret}" for t in current if t.platform != platform]
        entries += [f"{platform}:{new}"] if new else []
        deployment_env.update(path, {TOKENS: ",".join(entries)})
        deployment_env.refresh(path)
    _record(source, secret, user)


def rotate_adapter_token(platform: str, *, user) -> str:
    """A new random token for `platform` (made when it had none), in force for the next connection of any
    process; returns it. Other platforms' tokens are kept as they are."""
    new = secrets.token_urlsafe(24)
    _replace_adapter_token(platform, new, user=user, source=ROTATED)
    return new


def remove_adapter_token(platform: str, *, user) -> None:
    """No token for `platform` any more: its adapter is admitted from this machine (or
    MAIBOT_ADAPTER_ALLOW_FROM) without one, as the standalone adapter's legacy mode connects."""
    _replace_adapter_token(platform, None, user=user, source=CHANGED)


def set_model_key(variable: str, value: str, *, user) -> None:
    """Replace a model key the config uses (`variable` one it names), in force from the next model call."""
    if variable not in _model_variables() or variable not in llm_key_variables():
        raise SecretError(_("There is no such secret."))
    secret = _find(f"model:{variable}")
    _changeable(secret)
    value = value.strip()
    if not value:
        raise SecretError(_("Give the new key."))
    if len(value) > MAX_KEY_LENGTH or any(c.isspace() for c in value):
        raise SecretError(_("A key is one line without spaces, at most 512 characters."))
    with _file_lock():
        path = deployment_env.default_path()
        deployment_env.update(path, {variable: value})
        deployment_env.refresh(path)
    _record(CHANGED, secret, user)
