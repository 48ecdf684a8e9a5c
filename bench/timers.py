"""Benchmark: timer firing on the embedded default (SQLite) with 10,000 active cron timers.

  1. dispatcher cost per tick, in-process: TimerSource.run_due with nothing due, and with all
     10,000 timers due at once (claimed in batches of scheduling.batch_size);
  2. trickle, real `manage.py qcluster`: one-shot timers due one after another while the 10,000
     cron timers are active but not due — fire lateness per timer;
  3. burst, real cluster: all 10,000 `cron:* * * * *` timers due at the same instant;
  4. staggered, real cluster: the 10,000 timers due 1 ms apart (each its own claim).
Fire lateness = TimerFiring.fired_at - due_at (the claim, written in the same transaction that
advances next_fire). Hand-off = enqueued_at - due_at (the django-q2 task is in the queue).

    .venv/bin/python bench/timers.py [--timers 10000] [--trickle 100]
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


def summary(values_ms: list[float]) -> str:
    return f"p50={statistics.median(values_ms):.0f} ms  p99={pct(values_ms, 0.99):.0f} ms  max={max(values_ms):.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timers", type=int, default=10_000, help="active cron timers")
    parser.add_argument("--trickle", type=int, default=100, help="one-shot timers in the trickle phase")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between trickle timers' due instants")
    parser.add_argument("--ticks", type=int, default=200, help="idle run_due calls to time")
    args = parser.parse_args()

    data_dir, env = embedded_default("maibot-bench-timers-")
    from django.utils import timezone

    from chat.services import session_get_or_create
    from scheduling.life.models import FiringStatus, Timer, TimerFiring
    from scheduling.life.timers import TimerSource
    from scheduling.models import Actor

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, SQLite")
    sessions = [session_get_or_create(platform="bench", chat_type="private", user_id=f"u{i}") for i in range(500)]
    far = timezone.now() + timedelta(hours=1)
    timers = [
        Timer(
            label=f"cron {i}",
            payload="bench: think about it",
            spec="cron:* * * * *",
            kind="cron",
            session=sessions[i % len(sessions)],
            next_fire=far,
            created_via=Actor.SYSTEM,
        )
        for i in range(args.timers)
    ]
    Timer.objects.bulk_create(timers, batch_size=1000)
    ids = [t.pk for t in timers]
    print(f"{args.timers} active cron timers (cron:* * * * *)")

    # --- 1. dispatcher cost per tick -------------------------------------------------------------
    source = TimerSource(enqueue=lambda firing_ids: None)
    source._last_maintenance = timezone.now() + timedelta(days=1)  # time the claim path alone
    idle = []
    for _ in range(args.ticks):
        started = time.perf_counter()
        source.run_due(timezone.now())
        source.next_due()
        idle.append((time.perf_counter() - started) * 1000)
    print(f"tick, nothing due (run_due + next_due): mean={statistics.mean(idle):.2f} ms  p99={pct(idle, 0.99):.2f} ms")

    due = timezone.now()
    Timer.objects.filter(pk__in=ids).update(next_fire=due)
    rounds = []
    started_all = time.perf_counter()
    while True:
        started = time.perf_counter()
        more = source.run_due(timezone.now())
        rounds.append((time.perf_counter() - started) * 1000)
        if not more:
            break
    total = time.perf_counter() - started_all
    fired = TimerFiring.objects.count()
    print(
        f"tick, all due: {fired} firings in {len(rounds)} run_due calls, {total:.2f} s  "
        f"(per call mean={statistics.mean(rounds):.0f} ms, max={max(rounds):.0f} ms; "
        f"{fired / total:.0f} firings/s)"
    )
    TimerFiring.objects.all().delete()
    Timer.objects.filter(pk__in=ids).update(next_fire=far, fire_count=0, last_fired_at=None)

    # --- real cluster ----------------------------------------------------------------------------
    log = open(data_dir / "qcluster.log", "w")
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(4)  # cluster start-up

        # --- 2. trickle --------------------------------------------------------------------------
        base = timezone.now() + timedelta(seconds=2)
        one_shots = [
            Timer(
                label=f"once {i}",
                payload="say:bench",
                spec="1s",
                kind="after",
                session=sessions[i % len(sessions)],
                next_fire=base + timedelta(seconds=args.gap * i),
                created_via=Actor.SYSTEM,
            )
            for i in range(args.trickle)
        ]
        Timer.objects.bulk_create(one_shots)
        trickle_ids = [t.pk for t in one_shots]
        deadline = time.monotonic() + 30 + args.gap * args.trickle
        while TimerFiring.objects.filter(timer_id__in=trickle_ids).count() < args.trickle:
            if time.monotonic() > deadline:
                raise SystemExit("trickle: not every timer fired in time")
            time.sleep(0.2)
        late = [f.lateness_seconds * 1000 for f in TimerFiring.objects.filter(timer_id__in=trickle_ids)]
        print(f"trickle  n={len(late)}  fire lateness {summary(late)}")

        # --- 3. burst ----------------------------------------------------------------------------
        due = (timezone.now() + timedelta(seconds=6)).replace(microsecond=0)
        Timer.objects.filter(pk__in=ids).update(next_fire=due)
        burst = TimerFiring.objects.filter(due_at=due)
        deadline = time.monotonic() + 6 + 60
        time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.5)
        # Poll gently (twice a second): the cluster shares the 2 cores with this script.
        while burst.count() < args.timers:
            if time.monotonic() > deadline:
                raise SystemExit("burst: not every timer fired within 60 s")
            time.sleep(0.5)
        moved = Timer.objects.filter(pk__in=ids, next_fire__gt=due).count()
        # Keep the next minute's fire out of the figures that follow.
        Timer.objects.filter(pk__in=ids).update(next_fire=far)
        while burst.filter(enqueued_at__isnull=True).exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        firings = list(burst.values_list("fired_at", "enqueued_at"))
        late = [(f - due).total_seconds() * 1000 for f, _ in firings]
        handoff = [(e - due).total_seconds() * 1000 for _, e in firings if e is not None]
        print(f"burst    n={len(late)}  fire lateness {summary(late)}")
        if handoff:
            print(f"burst    hand-off to the task queue ({len(handoff)} enqueued) {summary(handoff)}")
        print(
            f"burst    firings of that instant: {len(firings)} for {args.timers} timers; "
            f"moved to their next minute: {moved}"
        )
        time.sleep(10)
        done = burst.exclude(status=FiringStatus.PENDING).count()
        print(f"burst    life-loop turns started by the 2 workers within ~10 s of the hand-off: {done}")

        # --- 4. staggered ------------------------------------------------------------------------
        # Every timer at its own instant (10,000 in a 10 s window): no two share a claim.
        start = timezone.now() + timedelta(seconds=4)
        stagger = [Timer(pk=pk, next_fire=start + timedelta(milliseconds=i)) for i, pk in enumerate(ids)]
        Timer.objects.bulk_update(stagger, ["next_fire"], batch_size=1000)
        deadline = time.monotonic() + 4 + 10 + 60
        time.sleep(max(0.0, (start - timezone.now()).total_seconds()) + 10)
        staggered = TimerFiring.objects.filter(due_at__gte=start)
        while staggered.count() < args.timers:
            if time.monotonic() > deadline:
                raise SystemExit("staggered: not every timer fired within 60 s")
            time.sleep(0.5)
        late = [f.lateness_seconds * 1000 for f in staggered]
        print(f"stagger  n={len(late)} (one instant each, 1 ms apart)  fire lateness {summary(late)}")
    finally:
        cluster.terminate()
        cluster.wait(timeout=60)
        log.close()


if __name__ == "__main__":
    main()
