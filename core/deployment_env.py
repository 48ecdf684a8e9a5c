"""Deployment settings the browser set-up page keeps in the data dir (`deployment.env`): the model's API
key, the adapter tokens, and the host and origin the operator used (core.hosts); an operator may add
ALLOWED_HOSTS there too. They are read like environment variables, and the real environment always wins.

Only these names are read from the file (a line naming anything else is ignored), it is written atomically
with mode 0600, and its values never appear in a page or a log. `serve` restarts the cluster when it
changes, so both processes use the new key; the web process applies it at once (core.setup).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE_NAME = "deployment.env"
KEYS = ("OPENAI_API_KEY", "MAIBOT_ADAPTER_TOKENS", "MAIBOT_SETUP_HOST", "MAIBOT_SETUP_ORIGIN", "ALLOWED_HOSTS")
MAX_VALUE_LENGTH = 4096


def read(path: Path) -> dict[str, str]:
    """The file's allowed `NAME=value` lines (missing file: none)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    values = {}
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and name.strip() in KEYS:
            values[name.strip()] = value.strip()
    return values


def load_into_environ(path: Path) -> None:
    """Put the file's values in os.environ where the environment does not set them already."""
    for name, value in read(path).items():
        os.environ.setdefault(name, value)


def update(path: Path, values: dict[str, str]) -> None:
    """Merge `values` into the file (an empty value removes the name), atomically, mode 0600."""
    for name, value in values.items():
        if name not in KEYS:
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
