"""Benchmark: the cost of running plugins in runner subprocesses (plugins/runner.py).

Loads the example plugins `weather` and `unruly` (tests/plugins/fixtures) into a plugin host on the
embedded default, then measures:
  1. runner start: loading one plugin in a fresh runner (a reload), p50/max;
  2. a component call through the runner (unruly_status: no capability call), p50/p99;
  3. a call that makes three capability calls back to the host (get_weather: config.get,
     chat.get_all_streams, message.get_recent), p50/p99;
  4. a crash-to-running-again time (os._exit in the plugin, restart backoff 0.05 s);
  5. resident memory of one idle runner.

    .venv/bin/python bench/plugin_runner.py [--calls 500] [--reloads 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, pct  # noqa: E402


def tree_rss_kb(pid: int) -> int:
    """Resident memory of a process and its descendants (a sandboxed runner's pid is bwrap's)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--reloads", type=int, default=10)
    args = parser.parse_args()
    embedded_default("maibot-bench-plugins-")

    from chat.services import session_get_or_create
    from core import config
    from plugins.host import PluginHost
    from tests.plugins.conftest import copy_plugins

    # A chat the capability calls find (message.get_recent answers an unknown one with an error).
    stream_id = session_get_or_create(platform="qq", chat_type="private", user_id="bench").session_id
    directory = copy_plugins(Path(tempfile.mkdtemp()) / "plugins", "weather", "unruly")
    with config.override(plugins={"restart_backoff_seconds": 0.05}):
        host = PluginHost()
        started = time.perf_counter()
        host.load_all(directory)
        first_load = time.perf_counter() - started
        try:
            unruly, weather = host.records["test.maibot.unruly"], host.records["test.maibot.weather"]
            status = next(c for c in unruly.components if c.name == "unruly_status")
            crash = next(c for c in unruly.components if c.name == "unruly_crash")
            forecast = next(c for c in weather.components if c.name == "get_weather")

            def timed(record, component, call_args, n):
                out = []
                for _ in range(n):
                    t = time.perf_counter()
                    host.invoke(record, component, call_args, 30)
                    out.append((time.perf_counter() - t) * 1000)
                return out

            timed(unruly, status, {}, 20)  # warm up
            plain = timed(unruly, status, {}, args.calls)
            with_caps = timed(weather, forecast, {"city": "Paris", "stream_id": stream_id}, args.calls)
            reloads = []
            for _ in range(args.reloads):
                t = time.perf_counter()
                assert host.reload(unruly.plugin_id).ok
                reloads.append((time.perf_counter() - t) * 1000)
            pid = unruly.runner_pid
            rss_kb = tree_rss_kb(pid)
            t = time.perf_counter()
            try:
                host.invoke(unruly, crash, {}, 30)
            except Exception:
                pass
            while not (unruly.runner_state == "running" and unruly.runner_pid not in (None, pid)):
                time.sleep(0.005)
            recovery = (time.perf_counter() - t) * 1000
        finally:
            host.stop()

    print(f"# plugin runners — {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"first load of 2 plugins (2 runners in parallel): {first_load * 1000:.0f} ms")
    print(f"reload (new runner, swap):  p50 {pct(reloads, 0.5):.0f} ms, max {max(reloads):.0f} ms")
    print(f"call, no capability:        p50 {pct(plain, 0.5):.2f} ms, p99 {pct(plain, 0.99):.2f} ms")
    print(f"call with 3 capability calls: p50 {pct(with_caps, 0.5):.2f} ms, p99 {pct(with_caps, 0.99):.2f} ms")
    print(f"crash to running again:     {recovery:.0f} ms (backoff 50 ms)")
    print(f"idle runner resident memory (its process tree): {rss_kb / 1024:.1f} MB")


if __name__ == "__main__":
    main()
