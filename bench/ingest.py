"""Benchmark: adapter ingest and outbound delivery through a real daphne with the real maim_message 0.6.8 client.

Starts its own daphne on a temporary SQLite data dir (the embedded default), then
1. ingest: one client sends N messages as fast as it can; reports stored msg/s and the p50/p99 latency
   from the client's send (message_info.time) to the row being written (Message.created_at);
2. outbound: N messages queued at once through the send service (messages_send); reports the time
   until the client has received all of them, as msg/s.
It also prints the server process's CPU time per message (user + system), a figure that holds when
the machine is shared, the load average, which says how shared it was, and the server's garbage
collections in each phase (bench.common.GC_PROBE).
Usage: .venv/bin/python bench/ingest.py [--messages 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port, gc_summary, never_echoes, pct, with_gc_probe  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux): the server's cost, whatever the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def at_least(n: int, count, what: str, timeout: float = 120) -> None:
    """Wait until `count()` (ORM) reaches n; a run that loses messages ends with how far it got."""
    from asgiref.sync import sync_to_async

    deadline = time.monotonic() + timeout
    while (reached := await sync_to_async(count)()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {reached} of {n} messages {what} after {timeout:.0f} s (see the server's log)")
        await asyncio.sleep(0.05)


async def run(n: int, base: str, server_pid: int, gc_log: Path) -> None:
    from asgiref.sync import sync_to_async
    from maim_message import BaseMessageInfo, FormatInfo, MessageBase, RouteConfig, Router, Seg, TargetConfig, UserInfo

    from chat.models import ChatSession, Message
    from chat.services import Outbound, messages_send

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    received = 0
    all_received = asyncio.Event()
    last_received_at = 0.0

    async def on_message(message: dict) -> None:
        nonlocal received, last_received_at
        received += 1
        if received == n:
            last_received_at = time.time()
            all_received.set()

    await sync_to_async(never_echoes)("qq")
    router = Router(
        RouteConfig(route_config={"qq": TargetConfig(url=base.replace("http", "ws") + "/ws", token="bench")})
    )
    router.register_class_handler(on_message)
    task = asyncio.create_task(router.run())
    while not router.check_connection("qq"):
        await asyncio.sleep(0.05)
    client = router.clients["qq"]
    accept = ["text", "image", "emoji", "reply", "voice"]

    # --- ingest: frames built with the library first, so the timed loop is the client's send path
    frames = []
    for i in range(n):
        info = BaseMessageInfo(
            platform="qq",
            message_id=1_000_000 + i,
            time=0.0,
            user_info=UserInfo(platform="qq", user_id=10000 + i % 50, user_nickname=f"user{i % 50}"),
            format_info=FormatInfo(content_format=["text"], accept_format=accept),
            additional_config={},
        )
        msg = MessageBase(message_info=info, message_segment=Seg("seglist", [Seg("text", f"bench message {i} 你好")]))
        frames.append(msg.to_dict())
    cpu0 = cpu_seconds(server_pid)
    t0 = time.time()
    for frame in frames:
        frame["message_info"]["time"] = time.time()
        await client.send_message(frame)
    sent_at = time.time()

    def count() -> int:
        return Message.objects.filter(direction="in").count()

    await at_least(n, count, "stored")

    def figures() -> tuple[float, list[float]]:
        rows = list(Message.objects.filter(direction="in").values_list("time", "created_at"))
        last = max(c for _, c in rows).timestamp()
        return last, [(c - t).total_seconds() * 1000 for t, c in rows]

    cpu = cpu_seconds(server_pid) - cpu0
    last_stored, latencies = await sync_to_async(figures)()
    elapsed = last_stored - t0
    print(f"ingest:   {n} messages from one 0.6.8 client, all stored")
    print(f"          client send time {sent_at - t0:.2f} s ({n / (sent_at - t0):,.0f} msg/s offered)")
    print(f"          stored in {elapsed:.2f} s -> {n / elapsed:,.0f} msg/s")
    print(
        f"          latency send->stored: p50 {statistics.median(latencies):.1f} ms, "
        f"p99 {pct(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms"
    )
    print(
        f"          server CPU {cpu:.2f} s = {cpu / n * 1e6:.0f} us per message -> {n / cpu:,.0f} msg/s per busy core"
    )
    print(f"          server GC: {gc_summary(gc_log, t0, last_stored)}")

    # --- a lone message is not held back for a batch: paced sends, one every 10 ms
    def paced_latencies(first_id: int) -> list[float]:
        rows = Message.objects.filter(direction="in", platform_message_id__gte=str(first_id)).values_list(
            "time", "created_at"
        )
        return [(c - t).total_seconds() * 1000 for t, c in rows]

    paced = 300
    paced_from = time.time()
    for i in range(paced):
        frames[i]["message_info"]["message_id"] = 9_000_000 + i
        frames[i]["message_info"]["time"] = time.time()
        await client.send_message(frames[i])
        await asyncio.sleep(0.01)
    await at_least(n + paced, count, "stored")
    lone = await sync_to_async(paced_latencies)(9_000_000)
    print(
        f"paced:    {paced} messages 10 ms apart: latency p50 {statistics.median(lone):.1f} ms, "
        f"p99 {pct(lone, 0.99):.1f} ms, max {max(lone):.1f} ms"
    )
    print(f"          server GC: {gc_summary(gc_log, paced_from, time.time())}")

    # --- outbound
    def queue_outbound() -> float:
        session = ChatSession.objects.filter(platform="qq").first()
        start = time.time()
        messages_send([Outbound(session=session, source_kind="proactive", text=f"outbound {i}") for i in range(n)])
        return start

    start = await sync_to_async(queue_outbound)()
    queued = time.time()
    cpu0 = cpu_seconds(server_pid)
    await asyncio.wait_for(all_received.wait(), timeout=600)
    cpu = cpu_seconds(server_pid) - cpu0
    elapsed = last_received_at - queued
    print(f"outbound: {n} messages queued via messages_send in {queued - start:.2f} s")
    print(f"          all received by the client {elapsed:.2f} s after commit -> {n / elapsed:,.0f} msg/s")
    print(
        f"          server CPU {cpu:.2f} s = {cpu / n * 1e6:.0f} us per message -> {n / cpu:,.0f} msg/s per busy core"
    )

    def delivered() -> int:
        return Message.objects.filter(direction="out", delivery_status="sent").count()

    await at_least(n, delivered, "marked sent")
    print(f"          all {n} marked sent")
    await router.stop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()

    data_dir, env = embedded_default("maibot-bench-", MAIBOT_ADAPTER_TOKENS="bench", PYTHONUNBUFFERED="1")
    from core.config import BotConfig
    from maibot.management.commands.serve import daphne_argv

    port = free_port()
    env, gc_log = with_gc_probe(data_dir, env)
    log = open(data_dir / "daphne.log", "wb")
    argv = daphne_argv("127.0.0.1", port, keepalive_seconds=BotConfig().gateway.keepalive_seconds)
    if os.environ.get("BENCH_PROFILE"):
        # BENCH_PROFILE=file: profile the server's event-loop thread (for finding hot spots).
        argv[1:1] = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]]
    server = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"daphne did not start; see {data_dir / 'daphne.log'}") from None
                time.sleep(0.1)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"daphne on 127.0.0.1:{port}, SQLite in {data_dir}, {os.cpu_count()} CPUs, load average {load}")
        asyncio.run(run(args.messages, f"http://127.0.0.1:{port}", server.pid, gc_log))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
