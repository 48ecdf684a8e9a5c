"""Benchmark: the proactive message API on the embedded default (SQLite), over real HTTP.

Starts a real daphne server and a real `manage.py qcluster` against a fresh database in a temporary
data dir, creates an API token, then:
  1. send now: requests one after another; figure: request latency (the 201 says the message is
     stored and queued for its adapter: "sending"; no adapter is connected here);
  2. scheduled trickle: messages scheduled a little ahead through the API; figure: lateness
     (sent_at - send_at) of the dispatcher's delivery;
  3. scheduled burst: messages all due at one instant; figure: lateness of the last one.

    .venv/bin/python bench/api.py [--now 200] [--trickle 50] [--burst 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port, pct  # noqa: E402


def post(url: str, body: dict, token: str) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def summary(name: str, values_ms: list[float]) -> str:
    return (
        f"{name:<34} n={len(values_ms):<5} p50={statistics.median(values_ms):8.1f} ms  "
        f"p95={pct(values_ms, 0.95):8.1f} ms  max={max(values_ms):8.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--now", type=int, default=200, help="send-now requests")
    parser.add_argument("--trickle", type=int, default=50, help="scheduled messages, one after another")
    parser.add_argument("--burst", type=int, default=500, help="scheduled messages due at one instant")
    args = parser.parse_args()

    data_dir, env = embedded_default(
        "maibot-bench-api-",
        bot_config="[api]\nrate_limit_per_minute = 1000000\n[scheduling]\nmax_pending_per_session = 10000\n",
    )
    from api.access import api_token_create
    from scheduling.models import ScheduledMessage

    _, token = api_token_create(name="bench")
    port = free_port()
    logs = [open(data_dir / f"{name}.log", "w") for name in ("web", "cluster")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "maibot.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=logs[0],
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, stdout=logs[1], stderr=subprocess.STDOUT
        ),
    ]
    url = f"http://127.0.0.1:{port}/api/v1/messages"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("daphne did not start") from None
                time.sleep(0.1)
        anchor = {"channel_type": "qq", "channel_user_id": "10001"}
        post(url, {**anchor, "text": "warm-up"}, token)

        latencies = []
        for i in range(args.now):
            start = time.perf_counter()
            body = post(url, {**anchor, "text": f"now {i}"}, token)
            latencies.append((time.perf_counter() - start) * 1000)
            assert body["status"] == "sending", body

        trickle_ids = []
        for i in range(args.trickle):
            send_at = datetime.now(UTC) + timedelta(seconds=1)
            trickle_ids.append(post(url, {**anchor, "text": f"later {i}", "send_at": send_at.isoformat()}, token)["id"])
            time.sleep(0.05)

        # Far enough ahead that every request of the burst is in before it is due.
        burst_at = datetime.now(UTC) + timedelta(seconds=5 + args.burst * 0.1)
        burst_ids = [
            post(url, {**anchor, "text": f"burst {i}", "send_at": burst_at.isoformat()}, token)["id"]
            for i in range(args.burst)
        ]
        all_ids = trickle_ids + burst_ids
        deadline = time.monotonic() + 120
        while ScheduledMessage.objects.filter(pk__in=all_ids, status="sent").count() < len(all_ids):
            if time.monotonic() > deadline:
                raise SystemExit("scheduled messages were not all sent in time")
            time.sleep(0.2)

        def lateness(ids: list[str]) -> list[float]:
            return [t.lateness_seconds * 1000 for t in ScheduledMessage.objects.filter(pk__in=ids)]

        print(f"maibot proactive API benchmark — {platform.python_version()}, SQLite, {os.cpu_count()} CPUs")
        print(summary("send now: request latency", latencies))
        print(summary("scheduled trickle: lateness", lateness(trickle_ids)))
        print(summary(f"scheduled burst of {args.burst}: lateness", lateness(burst_ids)))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


if __name__ == "__main__":
    main()
