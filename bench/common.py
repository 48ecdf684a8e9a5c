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


def never_echoes(*platforms: str) -> None:
    """Record the platforms of a benchmark's adapters as shown never to echo (chat.delivery_gate): the
    clients they run answer nothing, and a fresh platform would get one message at a time for its first
    confirm window, which is not what a benchmark measures. Before the adapters connect."""
    from django.utils import timezone

    from chat.models import AdapterPlatform

    for platform in platforms:
        AdapterPlatform.objects.update_or_create(platform=platform, defaults={"no_echo_at": timezone.now()})


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


# Loaded into the server process (a sitecustomize on its PYTHONPATH): times every garbage collection
# through gc.callbacks. Each full (generation 2) collection is one line; the per-generation totals are
# written at most once a second and at each full collection, so the probe costs nothing measurable.
GC_PROBE = """
import gc, os, time
_log = open(os.environ["MAIBOT_BENCH_GC_LOG"], "a")
_totals = [[0, 0.0], [0, 0.0], [0, 0.0]]
_state = {"start": 0.0, "cpu": 0.0, "written": 0.0}
def _timed(phase, info):
    now = time.perf_counter()
    if phase == "start":
        _state["start"], _state["cpu"] = now, time.process_time()
        return
    gen, pause = info["generation"], now - _state["start"]
    _totals[gen][0] += 1
    _totals[gen][1] += pause
    if gen == 2:
        cpu = time.process_time() - _state["cpu"]
        _log.write(f"full {time.time():.3f} {pause * 1000:.1f} {cpu * 1000:.1f}\\n")
    if gen == 2 or now - _state["written"] > 1.0:
        _state["written"] = now
        flat = " ".join(f"{n} {t:.4f}" for n, t in _totals)
        _log.write(f"totals {time.time():.3f} {flat}\\n")
        _log.flush()
gc.callbacks.append(_timed)
"""


def with_gc_probe(data_dir: Path, env: dict) -> tuple[dict, Path]:
    """`env` for a server process that loads GC_PROBE, and the log it writes (for gc_summary)."""
    probe_dir = data_dir / "gc_probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(GC_PROBE, encoding="utf-8")
    gc_log = data_dir / "gc.log"
    env = {
        **env,
        "MAIBOT_BENCH_GC_LOG": str(gc_log),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), env.get("PYTHONPATH", "")])),
    }
    return env, gc_log


def gc_summary(log: Path, since: float, until: float) -> str:
    """The server's garbage collections between two instants, from the GC probe's log."""
    pauses, cpu, totals = [], [], []
    for line in log.read_text().splitlines():
        kind, at, *rest = line.split()
        if not since <= float(at) <= until + 1.5:  # totals are written up to a second late
            continue
        if kind == "full":
            pauses.append(float(rest[0]))
            cpu.append(float(rest[1]) if len(rest) > 1 else 0.0)
        elif kind == "totals":
            totals.append([float(x) for x in rest])
    if len(totals) < 2:
        # The totals are written at a collection at most once a second: fewer than two, few collections.
        return f"full (gen 2): {len(pauses)}; too few young collections to total"
    first, last = totals[0], totals[-1]
    spent = [(last[i] - first[i], last[i + 1] - first[i + 1]) for i in (0, 2, 4)]
    young = ", ".join(f"gen {g}: {n:.0f} in {t * 1000:.0f} ms" for g, (n, t) in enumerate(spent[:2]))
    full = ", ".join(f"{p:.0f}" for p in pauses) or "none"
    # The pause is wall time (what a reply waits); on a loaded machine the process's CPU time for the
    # same collection is the figure that depends less on the load.
    return (
        f"{young}; full (gen 2): {len(pauses)}, pauses ms: {full}; "
        f"longest {max(pauses, default=0):.0f} ms wall, {max(cpu, default=0):.0f} ms CPU"
    )
