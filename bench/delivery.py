"""Benchmark: scheduled messages end to end, timed at a real adapter (the maim_message 0.6.8 client).

Runs a real daphne and a real `manage.py qcluster` sharing a fresh database (the embedded default, or
PostgreSQL + Redis with --database-url / --redis-url), connects the real maim_message client to the
server as an adapter, then:
  1. trickle: single messages, each scheduled a little ahead, one after another;
  2. burst: 10,000 messages all due at the same instant, over 500 conversations (`--conversations`;
     with `--conversations 1` all for ONE conversation, the order they reached the adapter checked).
Lateness at the adapter = the client's receipt time - send_at (what a user would see); lateness written
= sent_at - send_at (the outbound row in the outbox), printed beside it.

    .venv/bin/python bench/delivery.py [--trickle 200] [--burst 10000] [--conversations 500]
    .venv/bin/python bench/delivery.py --trickle 0 --burst 2000 --conversations 1    # one conversation's burst
    .venv/bin/python bench/delivery.py --database-url postgres://postgres@127.0.0.1:5432/maibot_bench_delivery \\
        --redis-url redis://127.0.0.1:6379/8
The PostgreSQL database named is dropped and created afresh; the Redis database is flushed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port, fresh_postgres, never_echoes, pct  # noqa: E402

TOKEN = "bench"
PLATFORM = "bench"
# A conversation may hold a whole burst of pending messages written through the API (its cap is 20).
BOT_CONFIG = "[scheduling]\nmax_pending_per_session = 10000\n"


def texts(segment: dict) -> list[str]:
    if segment.get("type") == "seglist":
        return [t for s in segment.get("data") or [] for t in texts(s)]
    return [segment["data"]] if segment.get("type") == "text" else []


class Adapter:
    """The real maim_message client as the platform's adapter, noting when each text arrives."""

    def __init__(self, base: str) -> None:
        from maim_message import RouteConfig, Router, TargetConfig

        self.received: dict[str, float] = {}
        self.order: list[str] = []  # texts in the order they first arrived
        self.router = Router(
            RouteConfig(route_config={PLATFORM: TargetConfig(url=base.replace("http", "ws") + "/ws", token=TOKEN)})
        )
        self.router.register_class_handler(self.on_message)
        self.task: asyncio.Task | None = None

    async def on_message(self, message: dict) -> None:
        now = time.time()
        for text in texts(message.get("message_segment") or {}):
            if text not in self.received:
                self.received[text] = now
                self.order.append(text)

    async def start(self) -> None:
        await asyncio.to_thread(never_echoes, PLATFORM)
        self.task = asyncio.create_task(self.router.run())
        while not self.router.check_connection(PLATFORM):
            await asyncio.sleep(0.05)

    async def wait_for(self, wanted: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(t not in self.received for t in wanted):
            if time.monotonic() > deadline:
                missing = sum(t not in self.received for t in wanted)
                raise SystemExit(f"{missing} of {len(wanted)} messages did not reach the adapter in {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        await self.router.stop()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux): its cost, whatever else the machine runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace, base: str, pids: dict[str, int]) -> None:
    from asgiref.sync import sync_to_async
    from django.db import transaction
    from django.utils import timezone

    from chat.services import session_get_or_create
    from scheduling.models import Actor, ScheduledMessage
    from scheduling.services import SYSTEM, scheduled_message_create
    from scheduling.wakeups import dispatchers_wake

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    adapter = Adapter(base)
    await adapter.start()
    try:
        # --- trickle ---------------------------------------------------------------------------
        def create(i: int, user: str) -> tuple[str, datetime, str]:
            session = session_get_or_create(platform=PLATFORM, chat_type="private", user_id=user)
            text = f"trickle {i}"
            task = scheduled_message_create(
                session=session,
                send_at=timezone.now() + timedelta(seconds=1.0),
                message_text=text,
                acted_by=SYSTEM,
                replace_existing=False,
            ).task
            return task.pk, task.send_at, text

        trickle = []
        for i in range(args.trickle):
            trickle.append(await sync_to_async(create)(i, str(i // 15)))  # under the per-session pending cap
            await asyncio.sleep(args.gap)
        await adapter.wait_for([t for _, _, t in trickle], 60)

        def written(ids: list[str]) -> dict[str, float]:
            return {
                pk: (sent - send).total_seconds()
                for pk, sent, send in ScheduledMessage.objects.filter(pk__in=ids).values_list(
                    "pk", "sent_at", "send_at"
                )
                if sent is not None
            }

        wrote = await sync_to_async(written)([pk for pk, _, _ in trickle])
        at_adapter = [(adapter.received[text] - send_at.timestamp()) * 1000 for _, send_at, text in trickle]
        at_outbox = [wrote[pk] * 1000 for pk, _, _ in trickle]
        if trickle:
            print(
                f"trickle  n={len(at_adapter)}  at the adapter: p50 {statistics.median(at_adapter):.0f} ms  "
                f"p99 {pct(at_adapter, 0.99):.0f} ms  max {max(at_adapter):.0f} ms   "
                f"(written: p50 {statistics.median(at_outbox):.0f} ms, p99 {pct(at_outbox, 0.99):.0f} ms)"
            )

        # --- burst -----------------------------------------------------------------------------
        if not args.burst:
            return

        def api_rows(sessions: list, parked: datetime) -> list[str]:
            """The rows the proactive API writes (its own service, as a POST /api/v1/messages does)."""
            from api.access import api_token_create
            from api.messages import proactive_message_create

            token, _ = api_token_create(name="bench")
            ids = []
            for i in range(args.burst):
                with transaction.atomic():
                    session = sessions[i % len(sessions)]
                    ids.append(
                        proactive_message_create(
                            token=token, conversation_id=session.session_id, text=f"burst {i}", send_at=parked
                        ).pk
                    )
            return ids

        def create_burst() -> tuple[datetime, list[str]]:
            sessions = [
                session_get_or_create(platform=PLATFORM, chat_type="private", user_id=f"b{i}")
                for i in range(args.conversations)
            ]
            # Written with a due instant far ahead, then all moved to one instant a few seconds away in a
            # single UPDATE: the set-up's own duration does not eat into the lead.
            parked = timezone.now() + timedelta(days=1)
            if args.via == "api":
                ids = api_rows(sessions, parked)
            else:
                rows = [
                    ScheduledMessage(
                        session=sessions[i % len(sessions)],
                        chat_type="private",
                        message_text=f"burst {i}",
                        send_at=parked,
                        due_at=parked,
                        created_via=Actor.SYSTEM,
                    )
                    for i in range(args.burst)
                ]
                ScheduledMessage.objects.bulk_create(rows, batch_size=1000)
                ids = [r.pk for r in rows]
            due = (timezone.now() + timedelta(seconds=3)).replace(microsecond=0) + timedelta(seconds=1)
            ScheduledMessage.objects.filter(pk__in=ids).update(send_at=due, due_at=due)
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would
            return due, ids

        due, burst_ids = await sync_to_async(create_burst)()
        # The adapter stands in for another program (NapCat's adapter): its collector must not walk this
        # process's Django heap and the burst's set-up (a full collection of it took 0.1-0.4 s, mid-burst).
        gc.collect()
        gc.freeze()
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        if (due - timezone.now()).total_seconds() < 1:
            raise SystemExit("burst set-up took too long; the burst was already due")
        wanted = [f"burst {i}" for i in range(args.burst)]
        await adapter.wait_for(wanted, (due - timezone.now()).total_seconds() + 120)
        late = sorted(adapter.received[t] - due.timestamp() for t in wanted)
        cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
        wrote = sorted((await sync_to_async(written)(burst_ids)).values())
        if args.conversations == 1:
            arrived = [t for t in adapter.order if t.startswith("burst ")]
            in_order = "in order" if arrived == wanted else "OUT OF ORDER"

            def handed() -> list[float]:
                rows = ScheduledMessage.objects.filter(pk__in=burst_ids).values_list("sent_message__sent_at", "send_at")
                return sorted((sent - send).total_seconds() for sent, send in rows)

            out = await sync_to_async(handed)()

            def three(xs: list[float]) -> str:
                return f"{xs[0]:.2f} / {statistics.median(xs):.2f} / {xs[-1]:.2f} s"

            print(
                f"{len(late)} messages due at one instant for ONE conversation: first/median/last at the adapter "
                f"{three(late)} after due ({in_order}); written {three(wrote)}, handed to the socket {three(out)}"
            )
        print(
            f"burst    n={len(late)}  all at the adapter {late[-1]:.2f} s after the due instant "
            f"({len(late) / late[-1]:,.0f} msg/s)  first {late[0] * 1000:.0f} ms  p50 {statistics.median(late):.2f} s"
            f"   (all written {wrote[-1]:.2f} s after it)"
        )
        print("         CPU for the burst: " + ", ".join(f"{name} {secs:.2f} s" for name, secs in cpu.items()))
    finally:
        await adapter.stop()


def wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"daphne did not start; see {log}") from None
            time.sleep(0.1)


def wait_for_line(needle: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while needle not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"{needle!r} not seen; see {log}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trickle", type=int, default=200, help="single messages in the trickle phase")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between trickle messages")
    parser.add_argument("--burst", type=int, default=10_000, help="messages due at one instant")
    parser.add_argument("--conversations", type=int, default=500, help="conversations the burst is spread over")
    parser.add_argument(
        "--via", choices=("system", "api"), default="system", help="who writes the rows: the proactive API or not"
    )
    parser.add_argument("--database-url", default="", help="a PostgreSQL database to drop, create and use")
    parser.add_argument("--redis-url", default="", help="with --database-url: a Redis database to flush and use")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()

    extra = {
        "MAIBOT_ADAPTER_TOKENS": f"{PLATFORM}:{TOKEN}",
        "PYTHONUNBUFFERED": "1",
        "MAIBOT_Q_NAME": f"bench-{os.getpid()}",
    }
    if args.database_url:
        if args.redis_url:
            import redis

            redis.Redis.from_url(args.redis_url).flushdb()
        data_dir, env = fresh_postgres(args.database_url, redis_url=args.redis_url, **extra)
        (data_dir / "bot_config.toml").write_text(BOT_CONFIG, encoding="utf-8")
        setup = "PostgreSQL + Redis" if args.redis_url else "PostgreSQL"
    else:
        data_dir, env = embedded_default("maibot-bench-", bot_config=BOT_CONFIG, **extra)
        setup = "SQLite (the embedded default)"
    from django.db import connection

    from core.config import BotConfig
    from maibot.management.commands.serve import daphne_argv

    port = free_port()
    server_log, cluster_log = data_dir / "daphne.log", data_dir / "qcluster.log"
    with open(server_log, "wb") as out:
        server = subprocess.Popen(
            daphne_argv("127.0.0.1", port, keepalive_seconds=BotConfig().gateway.keepalive_seconds),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cluster_env = {**env, "LOG_LEVEL": "INFO"}  # its "dispatcher started" line says it is ready
    with open(cluster_log, "wb") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=cluster_env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(port, server, server_log)
        wait_for_line("dispatcher started", cluster, cluster_log)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{setup} ({connection.vendor}), load average {load}"
        )
        pids = {"server": server.pid, "cluster (dispatcher)": cluster.pid}
        asyncio.run(run(args, f"http://127.0.0.1:{port}", pids))
    finally:
        for proc in (cluster, server):
            proc.terminate()
        for proc in (cluster, server):
            proc.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
