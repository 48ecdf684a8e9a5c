"""Benchmark: HTTP requests served in parallel by the ASGI server of the embedded default.

Starts the ASGI server as `serve` starts it (daphne; `--server uvicorn` for uvicorn, if installed) and a
real `manage.py qcluster` on a fresh SQLite data dir, creates an API token, then runs `--clients`
keep-alive clients (threads, one connection each) for `--seconds` per phase:
  1. `GET /healthz`;
  2. `POST /api/v1/messages`, each a message scheduled an hour ahead for a distinct user (a new session
     each: the scheduling service's full write path, no delivery).
Prints per phase: requests answered, requests per second, latency p50 / p99 / max, and the answers that
were not 2xx (by status). The clients run in this process: their own CPU time is printed too, since on a
small machine they share its cores with the server.

    .venv/bin/python bench/http_parallel.py [--clients 8] [--seconds 10] [--server daphne|uvicorn]
    PYTHONPATH=/tmp/uv .venv/bin/python bench/http_parallel.py --server uvicorn   # after
    .venv/bin/pip install --target /tmp/uv uvicorn uvloop httptools websockets  (not into the project's venv)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port, pct  # noqa: E402

BOT_CONFIG = "[api]\nrate_limit_per_minute = 1000000\n[scheduling]\nmax_pending_per_session = 10000\n"


def server_argv(server: str, port: int) -> list[str]:
    if server == "daphne":
        from core.config import get_config
        from maibot.management.commands.serve import daphne_argv

        return daphne_argv("127.0.0.1", port, keepalive_seconds=get_config().gateway.keepalive_seconds)
    return [
        *(sys.executable, "-m", "uvicorn", "maibot.asgi:application", "--host", "127.0.0.1", "--port", str(port)),
        *("--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"),
        # The application decides the client address itself (maibot.proxies); it takes no lifespan events.
        *("--no-proxy-headers", "--lifespan", "off"),
    ]


class Client(threading.Thread):
    """One keep-alive connection sending `request()` until `stop` is set."""

    def __init__(self, port: int, request, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.request, self.stop = port, request, stop
        self.latencies: list[float] = []
        self.statuses: Counter[int] = Counter()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        n = 0
        while not self.stop.is_set():
            method, path, body, headers = self.request(self.name, n)
            began = time.perf_counter()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                response.read()
            except (OSError, http.client.HTTPException):
                self.statuses[0] += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                continue
            self.latencies.append((time.perf_counter() - began) * 1000)
            self.statuses[response.status] += 1
            n += 1
        conn.close()


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, every thread)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phase(name: str, port: int, request, *, clients: int, seconds: float, server: int) -> None:
    stop = threading.Event()
    threads = [Client(port, request, stop) for _ in range(clients)]
    server_cpu = cpu_seconds(server)
    cpu, began = time.process_time(), time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
    server_cpu = cpu_seconds(server) - server_cpu
    latencies = [v for t in threads for v in t.latencies]
    statuses = sum((t.statuses for t in threads), Counter())
    bad = {s: n for s, n in sorted(statuses.items()) if not 200 <= s < 300}
    print(
        f"{name:<44} {len(latencies):>6} answered  {len(latencies) / elapsed:>7.0f} req/s  "
        f"p50 {pct(latencies, 0.5):>7.1f} ms  p99 {pct(latencies, 0.99):>7.1f} ms  max {max(latencies):>7.1f} ms  "
        f"not 2xx: {bad or 'none'}  (server's CPU {server_cpu / elapsed * 100:.0f} %, the clients' "
        f"{cpu / elapsed * 100:.0f} % of a core)"
    )


def wait_until_listening(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start") from None
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne")
    args = parser.parse_args()
    data_dir, env = embedded_default("maibot-bench-http-", bot_config=BOT_CONFIG)
    from api.access import api_token_create

    _, token = api_token_create(name="bench")
    port = free_port()
    logs = [open(data_dir / f"{name}.log", "w") for name in ("web", "cluster")]
    procs = [
        subprocess.Popen(server_argv(args.server, port), cwd=ROOT, env=env, stdout=logs[0], stderr=subprocess.STDOUT),
        subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, stdout=logs[1], stderr=subprocess.STDOUT
        ),
    ]
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

    def healthz(client: str, n: int):
        return "GET", "/healthz", None, {}

    def schedule(client: str, n: int):
        body = {"channel_type": "qq", "channel_user_id": f"{client}-{n}", "text": f"bench {n}", "send_at": send_at}
        return "POST", "/api/v1/messages", json.dumps(body), headers

    try:
        wait_until_listening(port, procs[0])
        time.sleep(3)  # the cluster's first heartbeat: /healthz answers 200 from then on
        print(
            f"maibot HTTP benchmark — {args.server}, {args.clients} keep-alive clients, {args.seconds:g} s a phase; "
            f"Python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
        )
        phase("GET /healthz", port, healthz, clients=args.clients, seconds=args.seconds, server=procs[0].pid)
        phase(
            "POST /api/v1/messages (scheduled, distinct users)",
            port,
            schedule,
            clients=args.clients,
            seconds=args.seconds,
            server=procs[0].pid,
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


if __name__ == "__main__":
    main()
