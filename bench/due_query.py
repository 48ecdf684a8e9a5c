"""Benchmark: the dispatcher's cost per tick with few and with very many pending (future) messages.

A tick is what the dispatcher loop does when nothing is due: one round of every due source (expire
overdue rows, take back expired leases, claim due rows, the timers' round) and the look-ahead for the
next due instant. It is timed with 1,000 pending scheduled messages due in the future, then again after
the table has grown to 1,000,000 (--large); the target is the large figure within 1.5x of the small.
The small case is a compacted copy of the database with only the first 1,000, and the two are timed
in turns, blocks of 30 ticks each, so that a shared machine's changing load hits both alike. It prints
the query plans (EXPLAIN) of the tick's statements on the large table.

    .venv/bin/python bench/due_query.py                      # SQLite (the embedded default)
    .venv/bin/python bench/due_query.py --database-url postgres://postgres@127.0.0.1:5432/maibot_bench_due
The PostgreSQL database named is dropped and created afresh.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, fresh_postgres, pct  # noqa: E402


def grow(target: int, sessions: list, start: int) -> None:
    """Add pending messages, due from an hour to a year ahead, until the table holds `target`: rows as
    the model builds them, written with multi-row INSERTs (bulk_create's per-instance work would take
    most of an hour for a million)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from scheduling.models import Actor, ScheduledMessage

    now = timezone.now()
    template = ScheduledMessage(session=sessions[0], chat_type="private", message_text="x", send_at=now, due_at=now)
    template.created_via = Actor.SYSTEM
    fields = [f for f in ScheduledMessage._meta.concrete_fields]
    for f in fields:
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            setattr(template, f.attname, now)
    base = {f.attname: f.get_db_prep_save(getattr(template, f.attname), connection) for f in fields}
    table = connection.ops.quote_name(ScheduledMessage._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    per_statement = 1000  # rows per INSERT: 1000 x the columns stays under both databases' parameter limits
    one_row = f"({', '.join(['%s'] * len(fields))})"
    for first in range(start, target, per_statement):
        count = min(target, first + per_statement) - first
        params = []
        for i in range(first, first + count):
            at = connection.ops.adapt_datetimefield_value(now + timedelta(hours=1, seconds=(i * 7919) % (365 * 86400)))
            row = {
                **base,
                "id": f"sm_b{i:012d}",
                "session_id": sessions[i % len(sessions)].pk,
                "message_text": f"future {i}",
                "send_at": at,
                "due_at": at,
            }
            params.extend(row[f.attname] for f in fields)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {', '.join([one_row] * count)}", params)


def time_ticks(ticks: int, *, warm: int = 20) -> list[float]:
    """Milliseconds per tick (every source's round and the look-ahead), nothing due."""
    from scheduling.dispatcher import Dispatcher

    dispatcher = Dispatcher()
    for _ in range(warm):  # warm the caches and the connection
        dispatcher.tick()
        dispatcher.seconds_to_sleep()
    costs = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        more = dispatcher.tick()
        dispatcher.seconds_to_sleep()
        costs.append((time.perf_counter() - t0) * 1000)
        assert not more, "something was due: the benchmark measures idle ticks"
    return costs


def tick_queries() -> dict:
    """The statements of a tick on scheduled messages, as SELECTs (the UPDATEs select the same rows)."""
    from django.utils import timezone

    from scheduling.models import ScheduledMessage, ScheduledStatus

    now = timezone.now()
    return {
        "claim_due": ScheduledMessage.objects.filter(status=ScheduledStatus.PENDING, due_at__lte=now)
        .order_by("due_at")
        .values_list("pk", flat=True)[:2000],
        "expire_overdue": ScheduledMessage.objects.filter(
            status=ScheduledStatus.PENDING, due_at__lt=now - timedelta(days=1)
        ).order_by(),
        "recover_expired_leases": ScheduledMessage.objects.filter(
            status=ScheduledStatus.SENDING, lease_until__lt=now
        ).order_by(),
        "next_due (pending)": ScheduledMessage.objects.filter(status=ScheduledStatus.PENDING)
        .order_by("due_at")
        .values_list("due_at", flat=True)[:1],
        "next_due (leases)": ScheduledMessage.objects.filter(status=ScheduledStatus.SENDING)
        .order_by("lease_until")
        .values_list("lease_until", flat=True)[:1],
    }


def buffers() -> int:
    """PostgreSQL: the shared buffers the tick's statements touch (hit + read), a figure that does not
    depend on how busy the machine is."""
    import re

    total = 0
    for qs in tick_queries().values():
        plan = qs.explain(analyze=True, buffers=True)
        first = re.search(r"Buffers: shared((?: \w+=\d+)+)", plan)
        if first:
            total += sum(int(n) for n in re.findall(r"=(\d+)", first.group(1)))
    return total


def explain() -> None:
    for name, qs in tick_queries().items():
        print(f"  {name}: {' | '.join(qs.explain().splitlines())}")


def small_copy(keep: int, url: str) -> str:
    """A copy of the database with only its first `keep` messages, compacted: the small case, measured
    in turn with the large one so that both see the same load. Returns its NAME for Django."""
    from django.db import connection

    from scheduling.models import ScheduledMessage

    table = connection.ops.quote_name(ScheduledMessage._meta.db_table)
    large = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        small = str(Path(large).with_name("small.sqlite3"))
        with connection.cursor() as cursor:
            cursor.execute("VACUUM INTO %s", [small])
    else:
        import psycopg

        small = f"{large}_small"
        connection.close()
        with psycopg.connect(f"{url.rsplit('/', 1)[0]}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{small}"')
            admin.execute(f'CREATE DATABASE "{small}" TEMPLATE "{large}"')
    use(small)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE id > %s", [f"sm_b{keep - 1:012d}"])
        cursor.execute("VACUUM" if connection.vendor == "sqlite" else "VACUUM FULL ANALYZE")
    use(large)
    return small


def use(name: str) -> None:
    from django.db import connection

    connection.close()
    connection.settings_dict["NAME"] = name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--ticks", type=int, default=300, help="ticks timed on each table")
    parser.add_argument("--database-url", default="", help="a PostgreSQL database to drop, create and use")
    parser.add_argument("--reuse", action="store_true", help="PostgreSQL: keep the rows of an earlier run")
    args = parser.parse_args()

    if args.database_url:
        fresh_postgres(args.database_url, reuse=args.reuse)
    else:
        embedded_default("maibot-bench-due-")
    from django.db import connection

    from chat.services import session_get_or_create
    from scheduling.models import ScheduledMessage

    vendor = connection.vendor
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {vendor}, "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    sessions = [session_get_or_create(platform="bench", chat_type="private", user_id=str(i)) for i in range(1000)]
    t0 = time.perf_counter()
    have = ScheduledMessage.objects.count()
    if have < args.large:
        grow(args.large, sessions, have)
    if vendor == "postgresql":
        # What autovacuum does to a table after a load: statistics and the visibility map.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    print(f"table of {args.large:,} filled in {time.perf_counter() - t0:.0f} s")
    large = connection.settings_dict["NAME"]
    small = small_copy(args.small, args.database_url)
    # In turns, a block of ticks on each: a change in the machine's load hits both cases alike.
    costs: dict[str, list[float]] = {small: [], large: []}
    block = 30
    for _ in range(max(1, args.ticks // block)):
        for name in (small, large):
            use(name)
            costs[name].extend(time_ticks(block, warm=5))
    for size, name in ((args.small, small), (args.large, large)):
        use(name)
        figures = costs[name]
        touched = f"  buffers touched {buffers()}" if vendor == "postgresql" else ""
        print(
            f"{size:>9,} pending  tick p50 {statistics.median(figures):.3f} ms  p99 {pct(figures, 0.99):.3f} ms  "
            f"mean {statistics.fmean(figures):.3f} ms{touched}"
        )
    ratio = statistics.median(costs[large]) / statistics.median(costs[small])
    print(f"ratio large/small (p50): {ratio:.2f}x  (target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'})")
    print("plans on the large table:")
    explain()


if __name__ == "__main__":
    main()
