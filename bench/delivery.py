"""Benchmark: scheduled-message delivery lateness and burst throughput on the embedded default.

Runs a real `manage.py qcluster` (the only background process) against a fresh SQLite database in a
temporary data dir, then:
  1. trickle: single messages, each scheduled a little ahead, one after another;
  2. burst: 10,000 messages all due at the same instant.
Lateness = sent_at - send_at, where sent_at is taken right after the outbound Message row is written.

    .venv/bin/python bench/delivery.py [--trickle 200] [--burst 10000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, pct  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trickle", type=int, default=200, help="single messages in the trickle phase")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between trickle messages")
    parser.add_argument("--burst", type=int, default=10_000, help="messages due at one instant")
    args = parser.parse_args()

    data_dir, env = embedded_default("maibot-bench-")
    from django.utils import timezone

    from chat.services import session_get_or_create
    from scheduling.models import Actor, ScheduledMessage, ScheduledStatus
    from scheduling.services import SYSTEM, scheduled_message_create

    log = open(data_dir / "qcluster.log", "w")
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(4)  # cluster start-up
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, SQLite")

        # --- trickle ---------------------------------------------------------------------------
        session = session_get_or_create(platform="bench", chat_type="private", user_id="1")
        ids = []
        for i in range(args.trickle):
            task = scheduled_message_create(
                session=session,
                send_at=timezone.now() + timedelta(seconds=1.0),
                message_text=f"trickle {i}",
                acted_by=SYSTEM,
                replace_existing=False,
            ).task
            ids.append(task.pk)
            if len(ids) % 15 == 0:  # stay under the per-session pending cap
                session = session_get_or_create(platform="bench", chat_type="private", user_id=str(len(ids)))
            time.sleep(args.gap)
        deadline = time.monotonic() + 30
        while ScheduledMessage.objects.filter(pk__in=ids, status=ScheduledStatus.SENT).count() < len(ids):
            if time.monotonic() > deadline:
                raise SystemExit("trickle: not everything was sent within 30 s")
            time.sleep(0.2)
        late = [t.lateness_seconds * 1000 for t in ScheduledMessage.objects.filter(pk__in=ids)]
        print(
            f"trickle  n={len(late)}  lateness p50={statistics.median(late):.0f} ms  "
            f"p99={pct(late, 0.99):.0f} ms  max={max(late):.0f} ms"
        )

        # --- burst -----------------------------------------------------------------------------
        sessions = [session_get_or_create(platform="bench", chat_type="private", user_id=f"b{i}") for i in range(500)]
        due = (timezone.now() + timedelta(seconds=8)).replace(microsecond=0)
        rows = [
            ScheduledMessage(
                session=sessions[i % len(sessions)],
                chat_type="private",
                message_text=f"burst {i}",
                send_at=due,
                due_at=due,
                created_via=Actor.SYSTEM,
            )
            for i in range(args.burst)
        ]
        ScheduledMessage.objects.bulk_create(rows, batch_size=1000)
        burst_ids = [r.pk for r in rows]
        remaining = (due - timezone.now()).total_seconds()
        if remaining < 1:
            raise SystemExit("burst set-up took too long; the burst was already due")
        deadline = time.monotonic() + remaining + 60
        while ScheduledMessage.objects.filter(pk__in=burst_ids, status=ScheduledStatus.SENT).count() < args.burst:
            if time.monotonic() > deadline:
                raise SystemExit("burst: not everything was sent within 60 s")
            time.sleep(0.2)
        sent_at = list(ScheduledMessage.objects.filter(pk__in=burst_ids).values_list("sent_at", flat=True))
        late = sorted((s - due).total_seconds() for s in sent_at)
        span = late[-1]
        print(
            f"burst    n={len(late)}  all written {span:.2f} s after the due instant  "
            f"({len(late) / span:.0f} msg/s)  first={late[0] * 1000:.0f} ms  p50={statistics.median(late):.2f} s"
        )
    finally:
        cluster.terminate()
        cluster.wait(timeout=30)
        log.close()


if __name__ == "__main__":
    main()
