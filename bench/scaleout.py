"""Benchmark: the multi-process deployment (2 ASGI servers + 2 clusters behind HAProxy, PostgreSQL +
Redis) against 1 + 1 on PostgreSQL + Redis and the embedded default (1 + 1 on SQLite), same workload.

For each setup it starts real processes as `make run-cluster` / `make run` do (daphne with serve's
command line, `manage.py qcluster`, Debian's haproxy with config/haproxy.cfg), a fresh database (a
temporary SQLite data dir, or a database `maibot_bench_scaleout` re-created on --pg-url's server) and a
private redis-server, and two adapters (the real maim_message 0.6.8 client, platforms bench-a and
bench-b; on 2 + 2 the balancer puts one on each server). Figures, all measured by the clients:
  ingest      both adapters send --ingest messages each as fast as they can: stored msg/s;
  api         --api-seconds of POST /api/v1/messages (send now) from --api-concurrency threads: req/s;
  reply       --replies private messages, one at a time, each answered by the bot (offline mode,
              debounce 0), once the ingest's sessions have answered: adapter send → reply at the
              adapter, p50 / max;
  burst       --burst scheduled messages due at one instant (half per platform): due → last one at
              its adapter, and the median.
With --soak SECONDS only 2 + 2 runs, under a mixed load for that long, one round every --soak-round
seconds (10): 100 scheduled messages due over the next 5 s, 100 inbound, 20 proactive API sends; it
checks that every message arrived exactly once and every inbound one was stored, and prints the
scheduled messages' lateness at the adapters by fifths of the run and each process's memory after the
first round and at the end. With --kill-burst N only 2 + 2 runs: N
scheduled messages due at one instant, one cluster SIGKILLed (with its workers) once a tenth are sent;
it prints how many were sent, how many arrived, and how many arrived more than once (must be 0).

    .venv/bin/python bench/scaleout.py [--setups embedded,1+1,2+2] [--burst 2000] [--ingest 3000]
    .venv/bin/python bench/scaleout.py --soak 3600
    .venv/bin/python bench/scaleout.py --kill-burst 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import free_port, never_echoes, pct  # noqa: E402

BENCH_CONFIG = (
    "[chat]\ndebounce_seconds = 0.0\n"
    "[api]\nrate_limit_per_minute = 1000000\n"
    "[scheduling]\nmax_pending_per_session = 10000\n"
)
PLATFORMS = ("bench-a", "bench-b")
SETUPS = {"embedded": (1, 1, False), "1+1": (1, 1, True), "2+2": (2, 2, True)}


def wait_port(port: int, timeout: float = 90) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port} after {timeout} s")


class Stack:
    """The processes of one setup, started and stopped together."""

    def __init__(self, name: str, pg_url: str) -> None:
        self.name = name
        self.webs, self.clusters, self.scaled = SETUPS[name]
        self.data = Path(tempfile.mkdtemp(prefix=f"maibot-bench-scaleout-{name.replace('+', '')}-"))
        (self.data / "bot_config.toml").write_text(BENCH_CONFIG, encoding="utf-8")
        self.pg_url = pg_url
        self.procs: list[subprocess.Popen] = []
        self.named: dict[str, subprocess.Popen] = {}
        self.redis: subprocess.Popen | None = None

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "MAIBOT_DATA_DIR": str(self.data), "LOG_LEVEL": "WARNING", "MAIBOT_CONSOLE_SERVICES": "0"}
        for var in ("DATABASE_URL", "REDIS_URL"):
            env.pop(var, None)
        if self.scaled:
            redis_port = free_port()
            self.redis = subprocess.Popen(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            )
            wait_port(redis_port)
            import psycopg

            with psycopg.connect(self.pg_url.rstrip("/") + "/postgres", autocommit=True) as conn:
                conn.execute("DROP DATABASE IF EXISTS maibot_bench_scaleout WITH (FORCE)")
                conn.execute("CREATE DATABASE maibot_bench_scaleout")
            env["DATABASE_URL"] = self.pg_url.rstrip("/") + "/maibot_bench_scaleout"
            env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        return env

    def start(self) -> str:
        """Migrate, start everything, set up Django here; the URL adapters and API clients use."""
        env = self.environment()
        os.environ.clear()
        os.environ.update(env)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        import django

        django.setup()
        from maibot.management.commands.run_cluster import haproxy_argv, haproxy_env, web_server_env
        from maibot.management.commands.serve import daphne_argv

        ports = [free_port() for _ in range(self.webs)]
        web_env = {**env, **web_server_env()} if self.webs > 1 else env
        for i, port in enumerate(ports):
            self._spawn(daphne_argv("127.0.0.1", port, keepalive_seconds=30), web_env, f"web{i + 1}")
        for i in range(self.clusters):
            # INFO: its "dispatcher started" line says it is ready.
            self._spawn([sys.executable, "manage.py", "qcluster"], {**env, "LOG_LEVEL": "INFO"}, f"cluster{i + 1}")
        front = ports[0]
        if self.webs > 1:
            front = free_port()
            addrs = [f"127.0.0.1:{p}" for p in ports]
            self._spawn(haproxy_argv(), {**env, **haproxy_env(f"127.0.0.1:{front}", addrs)}, "haproxy")
        for port in ports:
            wait_port(port)
        wait_port(front)
        from django.db import close_old_connections

        deadline = time.monotonic() + 90
        while not all(
            "dispatcher started" in (self.data / f"cluster{i + 1}.log").read_text() for i in range(self.clusters)
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the clusters did not start")
            time.sleep(0.2)
        close_old_connections()
        return f"http://127.0.0.1:{front}"

    def _spawn(self, argv: list[str], env: dict[str, str], name: str) -> None:
        log = open(self.data / f"{name}.log", "w")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self.named[name] = proc

    def kill_tree(self, name: str) -> None:
        """SIGKILL a process and everything below it (a cluster with its workers)."""
        from tests.cluster_support import descendants

        proc = self.named[name]
        below = descendants(proc.pid)
        proc.kill()
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(10)
        shutil.rmtree(self.data, ignore_errors=True)


class Adapter:
    """The real maim_message 0.6.8 client; records each frame's arrival time and text."""

    def __init__(self, base: str, platform_name: str) -> None:
        from maim_message import RouteConfig, Router, TargetConfig

        self.platform = platform_name
        self.router = Router(
            RouteConfig(route_config={platform_name: TargetConfig(url=base.replace("http", "ws") + "/ws", token=None)})
        )
        self.router.register_class_handler(self._on)
        self.arrivals: list[tuple[float, str, str]] = []  # (time, user id, text)
        self.waiters: dict[str, asyncio.Future] = {}
        self.task: asyncio.Task | None = None

    async def _on(self, message: dict) -> None:
        info = message.get("message_info", {})
        user = str((info.get("user_info") or {}).get("user_id", ""))
        text = "".join(s.get("data", "") for s in message["message_segment"]["data"] if s.get("type") == "text")
        self.arrivals.append((time.time(), user, text))
        waiter = self.waiters.pop(user, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(time.time())

    async def start(self) -> Adapter:
        await db(never_echoes, self.platform)
        self.task = asyncio.create_task(self.router.run())
        deadline = time.monotonic() + 30
        while not self.router.check_connection(self.platform):
            if time.monotonic() > deadline:
                raise SystemExit(f"adapter {self.platform} did not connect")
            await asyncio.sleep(0.05)
        return self

    async def send(self, user_id: str, text: str) -> None:
        from maim_message import BaseMessageInfo, FormatInfo, MessageBase, Seg, UserInfo

        info = BaseMessageInfo(
            platform=self.platform,
            message_id=f"{user_id}-{time.time_ns()}",
            time=time.time(),
            user_info=UserInfo(platform=self.platform, user_id=user_id, user_nickname=f"u{user_id}"),
            format_info=FormatInfo(content_format=["text"], accept_format=["text", "image", "emoji", "reply"]),
        )
        frame = MessageBase(message_info=info, message_segment=Seg("seglist", [Seg("text", text)]), raw_message=text)
        ok = await self.router.clients[self.platform].send_message(frame.to_dict())
        if not ok:
            raise SystemExit(f"adapter {self.platform}: send failed")

    async def stop(self) -> None:
        await self.router.stop()
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


def db(fn, *args, **kwargs):
    from asgiref.sync import sync_to_async

    def run():
        from django.db import connection

        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(run, thread_sensitive=False)()


async def wait_until(check, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        await asyncio.sleep(interval)


def api_load(base: str, token: str, seconds: float, concurrency: int) -> float:
    """POST /api/v1/messages (send now) from `concurrency` threads for `seconds`: requests per second."""
    url = f"{base}/api/v1/messages"
    stop_at = time.monotonic() + seconds
    counts = [0] * concurrency
    errors: list[str] = []

    def worker(k: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            body = {"channel_type": PLATFORMS[k % 2], "channel_user_id": f"api{k}", "text": f"api {k} {n}"}
            req = urllib.request.Request(
                url,
                data=json.dumps(body).encode(),
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as response:
                    response.read()
                counts[k] += 1
            except Exception as exc:
                errors.append(repr(exc))
            n += 1

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"API errors ({len(errors)}): {errors[:3]}")
    return sum(counts) / (time.monotonic() - started)


async def settled(count, quiet: float = 1.0, timeout: float = 120.0) -> None:
    """Wait until `count()` (ORM, run through db) has not changed for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = await db(count), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise SystemExit(f"still changing after {timeout:.0f} s ({last})")
        await asyncio.sleep(0.1)
        now = await db(count)
        if now != last:
            last, since = now, time.monotonic()


async def measure(base: str, args) -> dict:
    from api.access import api_token_create
    from chat.models import Message
    from chat.services import session_get_or_create
    from scheduling.models import Actor, ScheduledMessage
    from scheduling.wakeups import dispatchers_wake

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    _, token = await db(api_token_create, name="bench")
    adapters = [await Adapter(base, p).start() for p in PLATFORMS]
    out: dict = {}
    try:
        # ingest
        n = args.ingest
        t0 = time.time()
        await asyncio.gather(*(a.send(f"in{j % 50}", f"ingest {j}") for a in adapters for j in range(n)))

        async def stored() -> bool:
            return await db(lambda: Message.objects.filter(direction="in", text__startswith="ingest ").count()) >= 2 * n

        await wait_until(stored, 300, "ingest stored", interval=0.02)
        out["ingest_msgs"] = 2 * n / (time.time() - t0)

        # The ingest's sessions answer their messages: the reply figures are taken once they have (no
        # outbound row written for a second), not while those replies still queue ahead of them.
        await settled(lambda: Message.objects.filter(direction="out").count())

        # reply latency (offline mode, debounce 0), one at a time on fresh private chats
        latencies = []
        for j in range(args.replies):
            adapter = adapters[j % 2]
            user = f"reply{j}"
            waiter = asyncio.get_running_loop().create_future()
            adapter.waiters[user] = waiter
            sent = time.time()
            await adapter.send(user, "hello")
            latencies.append((await asyncio.wait_for(waiter, 60) - sent) * 1000)
        out["reply_p50_ms"] = statistics.median(latencies)
        out["reply_max_ms"] = max(latencies)

        # API requests/s
        out["api_rps"] = await asyncio.to_thread(api_load, base, token, args.api_seconds, args.api_concurrency)

        # burst of scheduled messages due at one instant
        def schedule() -> tuple[float, int]:
            sessions = [
                session_get_or_create(platform=p, chat_type="private", user_id=f"burst{k}")
                for p in PLATFORMS
                for k in range(20)
            ]
            due = timezone_now() + timedelta(seconds=3 + args.burst / 2000)
            ScheduledMessage.objects.bulk_create(
                [
                    ScheduledMessage(
                        session=sessions[i % len(sessions)],
                        chat_type="private",
                        message_text=f"burst {i}",
                        send_at=due,
                        due_at=due,
                        created_via=Actor.SYSTEM,
                    )
                    for i in range(args.burst)
                ],
                batch_size=1000,
            )
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would
            return due.timestamp(), args.burst

        due_ts, count = await db(schedule)

        def burst_arrivals() -> list[float]:
            return [t for a in adapters for t, _, text in a.arrivals if text.startswith("burst ")]

        async def all_burst() -> bool:
            return len(burst_arrivals()) >= count

        await wait_until(all_burst, 300, "the burst at the adapters")
        late = sorted(t - due_ts for t in burst_arrivals())
        out["burst_last_s"] = late[-1]
        out["burst_p50_s"] = statistics.median(late)
        dupes = Counter(text for a in adapters for _, _, text in a.arrivals if text.startswith("burst "))
        out["burst_duplicates"] = sum(c - 1 for c in dupes.values())
    finally:
        for a in adapters:
            await a.stop()
    return out


def timezone_now() -> datetime:
    return datetime.now(UTC)


def rss_mb(stack: Stack) -> dict[str, float]:
    """Resident memory (VmRSS) of each process of the stack, with its children (a cluster's workers)."""
    from tests.cluster_support import descendants

    def rss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as fh:
                return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return 0

    return {
        name: round(sum(rss(pid) for pid in [proc.pid, *descendants(proc.pid)]) / 1024, 1)
        for name, proc in stack.named.items()
        if name.startswith(("web", "cluster"))
    }


async def soak(stack: Stack, base: str, seconds: float, round_seconds: float) -> dict:
    """Mixed load for `seconds`, one round every `round_seconds`: 100 scheduled messages due over the
    next 5 s (half per platform), 100 inbound messages (50 per adapter), 20 proactive API sends. Then
    every scheduled message must have arrived exactly once and every inbound one be stored. Reports the
    scheduled messages' lateness at the adapters by fifths of the run, and each process's memory after
    the first round and at the end."""
    from api.access import api_token_create
    from chat.models import Message
    from chat.services import session_get_or_create
    from scheduling.models import Actor, ScheduledMessage
    from scheduling.wakeups import dispatchers_wake

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    _, token = await db(api_token_create, name="soak")
    adapters = [await Adapter(base, p).start() for p in PLATFORMS]
    due_of: dict[str, float] = {}
    inbound = 0
    rss_first: dict[str, float] = {}
    try:
        start = time.monotonic()
        rnd = 0
        while time.monotonic() - start < seconds:
            rnd += 1
            round_started = time.monotonic()

            def schedule(r=rnd) -> dict[str, float]:
                texts = {}
                due0 = timezone_now() + timedelta(seconds=1)
                rows = []
                for i in range(100):
                    p = PLATFORMS[i % 2]
                    session = session_get_or_create(platform=p, chat_type="private", user_id=f"soak{i % 10}")
                    due = due0 + timedelta(seconds=i / 100 * 5)
                    text = f"soak {r} scheduled {i}"
                    rows.append(
                        ScheduledMessage(
                            session=session,
                            chat_type="private",
                            message_text=text,
                            send_at=due,
                            due_at=due,
                            created_via=Actor.SYSTEM,
                        )
                    )
                    texts[text] = due.timestamp()
                ScheduledMessage.objects.bulk_create(rows)
                dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would
                return texts

            due_of.update(await db(schedule))
            for j in range(100):
                await adapters[j % 2].send(f"soak-user{j % 7}", f"soak {rnd} inbound {j}")
                inbound += 1
            await asyncio.to_thread(api_load, base, token, 5, 4)
            if rnd == 1:
                rss_first = rss_mb(stack)
            # Pacing: the next round starts round_seconds after this one did (at once if it ran longer).
            await asyncio.sleep(max(0.0, round_seconds - (time.monotonic() - round_started)))
        expected = set(due_of)
        deadline = time.monotonic() + 300

        def arrived() -> Counter:
            return Counter(text for a in adapters for _, _, text in a.arrivals)

        while not expected <= set(arrived()):
            if time.monotonic() > deadline:
                raise SystemExit(f"soak: {len(expected - set(arrived()))} scheduled messages never arrived")
            await asyncio.sleep(0.5)
        counts = arrived()
        doubled = [t for t in expected if counts[t] != 1]
        stored = await db(lambda: Message.objects.filter(direction="in", text__startswith="soak ").count())
        first_arrival = {}
        for a in adapters:
            for t, _, text in a.arrivals:
                if text in due_of and text not in first_arrival:
                    first_arrival[text] = t
        # Lateness at the adapter (receipt - due), by fifths of the run in scheduling order.
        ordered = sorted(due_of, key=due_of.get)
        fifths = []
        for k in range(5):
            part = ordered[k * len(ordered) // 5 : (k + 1) * len(ordered) // 5]
            late = [(first_arrival[t] - due_of[t]) * 1000 for t in part]
            fifths.append(
                {"p50_ms": round(pct(late, 0.5)), "p99_ms": round(pct(late, 0.99)), "max_ms": round(max(late))}
            )
        return {
            "seconds": round(time.monotonic() - start),
            "rounds": rnd,
            "scheduled": len(expected),
            "doubled": len(doubled),
            "inbound_sent": inbound,
            "inbound_stored": stored,
            "scheduled_lateness_by_fifth": fifths,
            "rss_mb_after_first_round": rss_first,
            "rss_mb_at_end": rss_mb(stack),
        }
    finally:
        for a in adapters:
            await a.stop()


async def kill_burst(stack: Stack, base: str, n: int) -> dict:
    """`n` scheduled messages due at one instant on 2 + 2; cluster1 SIGKILLed (workers and all) once a
    tenth are sent. Every message must be sent once and reach its adapter once."""
    from chat.models import Message
    from chat.services import session_get_or_create
    from scheduling.models import Actor, ScheduledMessage
    from scheduling.wakeups import dispatchers_wake

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    adapters = [await Adapter(base, p).start() for p in PLATFORMS]
    try:

        def schedule() -> float:
            sessions = [
                session_get_or_create(platform=p, chat_type="private", user_id=f"kill{k}")
                for p in PLATFORMS
                for k in range(50)
            ]
            due = timezone_now() + timedelta(seconds=3 + n / 2000)
            ScheduledMessage.objects.bulk_create(
                [
                    ScheduledMessage(
                        session=sessions[i % len(sessions)],
                        chat_type="private",
                        message_text=f"kill {i}",
                        send_at=due,
                        due_at=due,
                        created_via=Actor.SYSTEM,
                    )
                    for i in range(n)
                ],
                batch_size=1000,
            )
            dispatchers_wake()  # a raw write wakes no dispatcher (the services do): as a service would
            return due.timestamp()

        due_ts = await db(schedule)

        def sent() -> int:
            return ScheduledMessage.objects.filter(message_text__startswith="kill ", status="sent").count()

        async def a_tenth() -> bool:
            return await db(sent) >= n // 10

        await wait_until(a_tenth, 300, "a tenth of the burst sent", interval=0.01)
        stack.kill_tree("cluster1")
        at_kill = await db(sent)

        def arrivals() -> Counter:
            return Counter(text for a in adapters for _, _, text in a.arrivals if text.startswith("kill "))

        async def all_arrived() -> bool:
            return len(arrivals()) >= n

        await wait_until(all_arrived, 600, "every message at its adapter", interval=0.2)
        last = max(t for a in adapters for t, _, text in a.arrivals if text.startswith("kill "))
        rows = await db(lambda: Message.objects.filter(source_kind="scheduled_send", text__startswith="kill ").count())
        counts = arrivals()
        return {
            "messages": n,
            "sent_at_kill": at_kill,
            "outbound_rows": rows,
            "arrived_distinct": len(counts),
            "arrived_twice_or_more": sum(1 for c in counts.values() if c > 1),
            "last_arrival_after_due_s": round(last - due_ts, 2),
        }
    finally:
        for a in adapters:
            await a.stop()


def run_one(args) -> None:
    stack = Stack(args.run, args.pg_url)
    try:
        base = stack.start()
        if args.kill_burst:
            result = asyncio.run(kill_burst(stack, base, args.kill_burst))
        else:
            result = asyncio.run(soak(stack, base, args.soak, args.soak_round) if args.soak else measure(base, args))
        print("RESULT " + json.dumps({"setup": args.run, **result}), flush=True)
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="embedded,1+1,2+2")
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--ingest", type=int, default=3000, help="messages per adapter")
    parser.add_argument("--replies", type=int, default=40)
    parser.add_argument("--api-seconds", type=float, default=8.0)
    parser.add_argument("--api-concurrency", type=int, default=8)
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432", help="a server, no database name")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of mixed load on 2 + 2 (checks exactly once)")
    parser.add_argument("--soak-round", type=float, default=10.0, help="seconds between the soak's rounds")
    parser.add_argument(
        "--kill-burst", type=int, default=0, help="N due at once on 2 + 2, one cluster SIGKILLed mid-burst"
    )
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one setup, in a process of its own
    args = parser.parse_args()
    if args.run:
        run_one(args)
        return
    if not (shutil.which("haproxy") or os.path.exists("/usr/sbin/haproxy")):
        raise SystemExit("haproxy is required: apt-get install haproxy")
    setups = ["2+2"] if args.soak or args.kill_burst else args.setups.split(",")
    results = []
    for name in setups:
        cmd = [sys.executable, __file__, "--run", name, *sys.argv[1:]]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    load = os.getloadavg()
    print(f"maibot scale-out benchmark — Python {platform.python_version()}, {os.cpu_count()} CPUs, load {load[0]:.1f}")
    if args.soak or args.kill_burst:
        print(json.dumps(results[0], indent=2))
        return
    header = (
        f"{'setup':<10}{'ingest msg/s':>14}{'API req/s':>11}{'reply p50':>11}{'reply max':>11}"
        f"{'burst last':>12}{'burst p50':>11}{'dup':>5}"
    )
    print(header)
    for r in results:
        print(
            f"{r['setup']:<10}{r['ingest_msgs']:>14.0f}{r['api_rps']:>11.0f}{r['reply_p50_ms']:>9.0f}ms"
            f"{r['reply_max_ms']:>9.0f}ms{r['burst_last_s']:>11.2f}s{r['burst_p50_s']:>10.2f}s{r['burst_duplicates']:>5}"
        )
    print(f"(burst of {args.burst} due at one instant; ingest {args.ingest} per adapter x 2; {args.replies} replies;")
    print(f" API: {args.api_concurrency} threads for {args.api_seconds:g} s, send now)")


if __name__ == "__main__":
    main()
