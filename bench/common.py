"""Helpers the benchmark scripts share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_default(
    prefix: str, *, bot_config: str = "", unset: tuple[str, ...] = (), **env: str
) -> tuple[Path, dict]:
    """A fresh temporary data dir on the embedded default (SQLite, ORM broker, in-memory channel layer):
    optionally a bot_config.toml, the environment set (`env`, MAIBOT_DATA_DIR; DATABASE_URL, REDIS_URL and
    `unset` removed), migrated, and Django set up in this process. Returns the data dir and the
    environment for the subprocesses a benchmark starts (LOG_LEVEL=WARNING)."""
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    if bot_config:
        (data_dir / "bot_config.toml").write_text(bot_config, encoding="utf-8")
    os.environ["MAIBOT_DATA_DIR"] = str(data_dir)
    os.environ.update(env)
    for var in ("DATABASE_URL", "REDIS_URL", *unset):
        os.environ.pop(var, None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")
    sub_env = {**os.environ, "LOG_LEVEL": "WARNING"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=sub_env, check=True)

    import django

    django.setup()
    return data_dir, sub_env


def fresh_postgres(url: str, *, redis_url: str = "", reuse: bool = False, **env: str) -> tuple[Path, dict]:
    """Drop and create the PostgreSQL database `url` names (never a shared one; with `reuse`, keep it as
    it is), migrate it, and set Django up on it, with a temporary data dir and REDIS_URL set or removed.
    Returns the data dir and the environment for the subprocesses a benchmark starts (LOG_LEVEL=WARNING)."""
    import psycopg

    base, name = url.rsplit("/", 1)
    if name in ("maibot", "test_maibot", "postgres"):
        raise SystemExit(f"refusing to drop the database {name!r}")
    if not reuse:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    data_dir = Path(tempfile.mkdtemp(prefix="maibot-bench-pg-"))
    os.environ["MAIBOT_DATA_DIR"] = str(data_dir)
    os.environ["DATABASE_URL"] = url
    os.environ.update(env)
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    else:
        os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")
    sub_env = {**os.environ, "LOG_LEVEL": "WARNING"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=sub_env, check=True)

    import django

    django.setup()
    return data_dir, sub_env
