"""Benchmark: 10,000 live session runtimes in one ASGI process (issue #18).

Starts its own daphne on a temporary SQLite data dir (the embedded default, in-memory channel layer) and
connects ONE real maim_message 0.6.8 client (Router) to /ws. Through that one connection, N different
people (user ids 1..N) each send one private message, paced at --rate messages per second; each gets
the bot's reply (the offline planner by default; `--llm`: the scripted FakeLLM of tests/fake_llm.py
answering every call with a `reply` tool call, in its own process, over the real openai client).
Every runtime stays alive (chat.max_runtimes is set above N, chat.idle_evict_seconds to an hour).

It prints, for the server process (read from /proc):
- resident memory (VmRSS) after a warm-up of --warmup sessions and after the N sessions: the extra
  memory N live runtimes cost (target <= 200 MB for 10,000);
- CPU used over --idle-seconds of quiet, before the sessions and after them, all runtimes still
  alive (target: near zero, i.e. no per-runtime polling);
- reply latency at the client, from just before its send to the reply's arrival: p50, p99, max
  against the target chat.debounce_seconds + 1 s;
- the runtimes alive, as the operator console's dashboard shows them (a logged-in GET of /admin/console/);
- an operator's admin pages while the sessions come (the chat sessions' list and the dashboard, fetched
  in turn by a logged-in client at an operator's pace, one a second): p50 / p99 / max (target p99 <= 200 ms);
- the server's garbage collections while the sessions came (a gc.callbacks probe, bench.common.GC_PROBE):
  the young ones' count and time, and each full (generation 2) collection's pause, during which the
  event loop, and every reply in flight, waits.

    .venv/bin/python bench/sessions.py [--sessions 10000] [--rate 500] [--debounce 1.0] [--llm] [--no-admin-pages]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import embedded_default, free_port, gc_summary, never_echoes, pct, with_gc_probe  # noqa: E402

FAKE_LLM_SERVER = """
import time
from tests.fake_llm import FakeLLM
fake = FakeLLM().start()
fake.default = lambda body: fake.tool_call("reply", {"text": "ok"})
print(fake.base_url, flush=True)
while True:
    time.sleep(3600)
"""
TOKEN = "bench"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def console_cookie() -> str:
    """A logged-in admin session for the console, written straight into the shared database."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench-password-x")
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


def runtimes_alive(base: str, cookie: str) -> int:
    """The dashboard's "Session runtimes … active" figure (the live registry of the server)."""
    request = urllib.request.Request(f"{base}/admin/console/", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=120) as response:
        html = response.read().decode()
    found = re.search(r'id="runtimes".*?class="console-figure">(\d+)<', html, re.S)
    if not found:
        raise RuntimeError("the dashboard shows no runtime count")
    return int(found.group(1))


ADMIN_PAGES = ("/admin/chat/chatsession/", "/admin/console/")


def admin_pages_meanwhile(base: str, cookie: str, stop: threading.Event) -> dict[str, list[float]]:
    """ADMIN_PAGES fetched in turn, one a second (an operator clicking, not a load of its own), until
    `stop`: milliseconds per page."""
    times: dict[str, list[float]] = {page: [] for page in ADMIN_PAGES}
    pages = itertools.cycle(ADMIN_PAGES)
    while not stop.wait(1.0):  # the pace being offered, not a wait for a condition
        page = next(pages)
        request = urllib.request.Request(f"{base}{page}", headers={"Cookie": cookie})
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            assert response.status == 200, (page, response.status)
        times[page].append((time.perf_counter() - t0) * 1000)
    return times


def idle_cpu(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)  # the quiet period being measured, not a wait for a condition
    return cpu_seconds(pid) - before


async def run(args, base: str, pid: int, cookie: str, debounce: float, gc_log: Path) -> None:
    from maim_message import BaseMessageInfo, FormatInfo, MessageBase, RouteConfig, Router, Seg, TargetConfig, UserInfo

    logging.getLogger("maim_message").setLevel(logging.WARNING)
    loop = asyncio.get_running_loop()
    sent_at: dict[str, float] = {}
    latency: dict[str, float] = {}
    extra_replies = 0
    expected = 0
    all_in = asyncio.Event()

    async def on_message(message: dict) -> None:
        nonlocal extra_replies
        now = time.time()
        user = str(message.get("message_info", {}).get("user_info", {}).get("user_id", ""))
        if user in latency or user not in sent_at:
            extra_replies += 1
            return
        latency[user] = now - sent_at[user]
        if len(latency) == expected:
            all_in.set()

    await asyncio.to_thread(never_echoes, "qq")
    router = Router(RouteConfig(route_config={"qq": TargetConfig(url=base.replace("http", "ws") + "/ws", token=TOKEN)}))
    router.register_class_handler(on_message)
    task = asyncio.create_task(router.run())
    while not router.check_connection("qq"):
        await asyncio.sleep(0.05)
    client = router.clients["qq"]
    accept = ["text", "image", "emoji", "reply", "voice"]

    def frame(user: int) -> dict:
        info = BaseMessageInfo(
            platform="qq",
            message_id=5_000_000 + user,
            time=0.0,
            user_info=UserInfo(platform="qq", user_id=user, user_nickname=f"user{user}"),
            format_info=FormatInfo(content_format=["text"], accept_format=accept),
            additional_config={},
        )
        return MessageBase(message_info=info, message_segment=Seg("seglist", [Seg("text", "hello 你好")])).to_dict()

    async def wave(first: int, n: int, rate: float) -> float:
        nonlocal expected
        expected += n
        frames = [frame(u) for u in range(first, first + n)]
        t0 = loop.time()
        for i, f in enumerate(frames):
            due = t0 + i / rate
            if due > loop.time():
                await asyncio.sleep(due - loop.time())  # pacing the offered load
            user = str(f["message_info"]["user_info"]["user_id"])
            now = time.time()
            f["message_info"]["time"] = now
            sent_at[user] = now
            await client.send_message(f)
        offered = loop.time() - t0
        await asyncio.wait_for(all_in.wait(), timeout=max(120.0, n / 10))
        all_in.clear()
        return offered

    # Warm-up: the code paths a first message takes (imports, caches, the first connection of a thread).
    await wave(1_000_000, args.warmup, 50)
    await asyncio.sleep(debounce + 2)  # let the warm-up's cycles finish recording
    rss_before = rss_mb(pid)
    alive_before = await asyncio.to_thread(runtimes_alive, base, cookie)
    cpu_idle_before = await asyncio.to_thread(idle_cpu, pid, args.idle_seconds)
    print(
        f"before:   RSS {rss_before:.1f} MB, {threads(pid)} threads, {alive_before} runtimes alive (warm-up), "
        f"idle CPU {cpu_idle_before:.3f} s over {args.idle_seconds:.0f} s"
    )

    cpu0 = cpu_seconds(pid)
    first_sent = time.time()
    stop_pages = threading.Event()
    pages = asyncio.create_task(
        asyncio.to_thread(admin_pages_meanwhile, base, cookie, stop_pages) if args.admin_pages else asyncio.sleep(0, {})
    )
    offered = await wave(1, args.sessions, args.rate)
    stop_pages.set()
    page_times = await pages
    last_reply = first_sent + max(sent_at[str(u)] - first_sent + latency[str(u)] for u in range(1, args.sessions + 1))
    busy_cpu = cpu_seconds(pid) - cpu0
    lat = [latency[str(u)] * 1000 for u in range(1, args.sessions + 1)]
    print(
        f"sessions: {args.sessions} people sent one message each through one connection in {offered:.1f} s "
        f"({args.sessions / offered:,.0f} msg/s offered); all {len(lat)} replied by "
        f"+{last_reply - first_sent:.1f} s; server CPU {busy_cpu:.1f} s ({busy_cpu / args.sessions * 1000:.2f} ms "
        f"per session)"
    )
    target = (debounce + 1.0) * 1000
    slow = sum(1 for v in lat if v > target)
    print(
        f"latency:  send -> reply at the client p50 {pct(lat, 0.5):.0f} ms, p99 {pct(lat, 0.99):.0f} ms, "
        f"max {max(lat):.0f} ms; target <= debounce {debounce:g} s + 1 s = {target:.0f} ms: "
        f"{'met' if slow == 0 else f'NOT met ({slow} replies slower)'}"
    )
    for page, ms in page_times.items():
        print(
            f"admin:    {page} while the sessions came: {len(ms)} fetched, p50 {pct(ms, 0.5):.0f} ms, "
            f"p99 {pct(ms, 0.99):.0f} ms, max {max(ms):.0f} ms; target p99 <= 200 ms: "
            f"{'met' if pct(ms, 0.99) <= 200 else 'NOT met'}"
        )
    # Does a reply get slower as more runtimes are alive? Latency by arrival order, in fifths.
    fifth = max(1, len(lat) // 5)
    slices = [lat[i : i + fifth] for i in range(0, fifth * 5, fifth)]
    print(
        "          by arrival order (fifths, p50/p99 ms): "
        + ", ".join(f"{pct(part, 0.5):.0f}/{pct(part, 0.99):.0f}" for part in slices if part)
    )
    await asyncio.sleep(1.5)  # the probe writes its totals at most a second late
    print(f"GC:       {gc_summary(gc_log, first_sent, last_reply)}")
    # Let every runtime finish its cycle (the reply is sent before the cycle record closes).
    await asyncio.sleep(2)
    rss_after = rss_mb(pid)
    alive_after = await asyncio.to_thread(runtimes_alive, base, cookie)
    cpu_idle_after = await asyncio.to_thread(idle_cpu, pid, args.idle_seconds)
    rss_idle = rss_mb(pid)
    extra = rss_idle - rss_before
    print(
        f"after:    RSS {rss_after:.1f} MB right after, {rss_idle:.1f} MB after the idle period, "
        f"{threads(pid)} threads, {alive_after} runtimes alive"
    )
    print(
        f"memory:   extra RSS for {alive_after - alive_before} more live runtimes: {extra:.1f} MB "
        f"({extra * 1024 / max(1, alive_after - alive_before):.1f} KB each); target <= 200 MB for 10,000: "
        + (("met" if extra <= 200 else "NOT met") if args.sessions >= 10_000 else "(judged at 10,000 sessions)")
    )
    share = cpu_idle_after / args.idle_seconds * 100
    print(
        f"idle CPU: {cpu_idle_after:.3f} s over {args.idle_seconds:.0f} s with {alive_after} runtimes alive "
        f"({share:.2f}% of a core; {cpu_idle_before:.3f} s with {alive_before} before)"
    )
    if extra_replies:
        print(f"WARNING: {extra_replies} replies nobody was waiting for (a second reply to someone)")
    await router.stop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0, help="messages per second offered")
    parser.add_argument("--debounce", type=float, default=1.0, help="chat.debounce_seconds")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--llm", action="store_true", help="the scripted FakeLLM instead of the offline planner")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument(
        "--admin-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fetch an operator's admin pages while the sessions come (default: yes)",
    )
    args = parser.parse_args()

    llm_proc = None
    llm = ""
    if args.llm:
        llm_proc = subprocess.Popen(
            [sys.executable, "-c", FAKE_LLM_SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        base_url = llm_proc.stdout.readline().strip()
        llm = f'[llm]\nbase_url = "{base_url}"\nmodel = "fake-model"\nmax_retries = 0\n'
    bot_config = (
        f"{llm}[chat]\ndebounce_seconds = {args.debounce}\n"
        f"max_runtimes = {args.sessions + args.warmup + 100}\nidle_evict_seconds = 3600\n"
    )
    data_dir, env = embedded_default(
        "maibot-bench-sessions-",
        bot_config=bot_config,
        unset=("OPENAI_BASE_URL", "MAIBOT_LLM_MODEL"),
        MAIBOT_ADAPTER_TOKENS=TOKEN,
        PYTHONUNBUFFERED="1",
    )
    from core.config import BotConfig
    from maibot.management.commands.serve import daphne_argv

    cookie = console_cookie()
    port = free_port()
    env, gc_log = with_gc_probe(data_dir, env)
    log = open(data_dir / "daphne.log", "wb")
    argv = daphne_argv("127.0.0.1", port, keepalive_seconds=BotConfig().gateway.keepalive_seconds)
    if os.environ.get("BENCH_PROFILE"):
        argv[1:1] = ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]]
    server = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
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
        print(
            f"machine:  {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {load}; daphne on 127.0.0.1:{port}, SQLite in {data_dir}; "
            f"{'FakeLLM (scripted reply)' if args.llm else 'offline planner'}, debounce {args.debounce:g} s"
        )
        asyncio.run(run(args, f"http://127.0.0.1:{port}", server.pid, cookie, args.debounce, gc_log))
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
        if llm_proc is not None:
            llm_proc.terminate()
            llm_proc.wait()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
