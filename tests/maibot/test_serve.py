"""`manage.py serve` supervises: a SIGKILLed cluster is restarted (its orphaned workers killed) while the
ASGI server keeps serving, the restart is in the console's log, and on stop no process it started is left;
a web child SIGKILLed while it hands a burst over is restarted, and the rows it had claimed go out from
its successor within seconds (its heartbeat runs out), not after the 60 s delivery lease. The supervisor
watching them is no Django process but a small one of the standard library. A port another program holds
stops serve at once with one line naming the port and the fix, before anything starts, and also when it
is found taken after the web child died, instead of restarting the web child forever."""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import socket
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from chat.models import AdapterConnection, Message
from chat.services import message_send
from core.models import LogEntry
from scheduling.models import Actor, ScheduledMessage
from scheduling.wakeups import dispatchers_wake
from tests.chat.napcat_standin import NapCatStandIn
from tests.cluster_support import check_arrivals_after_kill, heartbeat_name, kill_while_claimed
from tests.conftest import Proc, db, free_port, subprocess_env, wait_for, wait_for_async

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid → (parent pid, process group, command line) of every process on the machine."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return out


def _child(parent: int, needle: str) -> int | None:
    return next((pid for pid, (ppid, _, cmd) in _processes().items() if ppid == parent and needle in cmd), None)


def _group(leader: int) -> set[int]:
    return {pid for pid, (_, pgrp, _) in _processes().items() if pgrp == leader}


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")) / 1024


# The select system calls by architecture, and which of their arguments is the timeout.
SELECT_SYSCALLS = {"x86_64": {23, 270}, "aarch64": {72}}
SELECT_TIMEOUT_ARG = 4


def _syscall(pid: int) -> list[str]:
    """What `pid`'s main thread is blocked in: the system call's number and its arguments
    (/proc/<pid>/syscall; "running" when it is not in one)."""
    return Path(f"/proc/{pid}/syscall").read_text().split()


def _waits_without_timeout(pid: int) -> bool:
    fields = _syscall(pid)
    if fields[0] == "running":
        return False
    return int(fields[0]) in SELECT_SYSCALLS[platform.machine()] and int(fields[1 + SELECT_TIMEOUT_ARG], 16) == 0


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.long
def test_a_killed_cluster_is_restarted_while_the_server_serves_and_stop_leaves_nothing(tmp_path):
    port = free_port()
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"), LOG_LEVEL="INFO")
    serve = Proc([sys.executable, "manage.py", "serve", "--port", str(port)], env, tmp_path / "serve.log")
    try:
        login = f"http://127.0.0.1:{port}/admin/login/"
        assert wait_for(lambda: _answers(login), timeout=60), serve.output()
        web = _child(serve.popen.pid, "daphne")
        assert wait_for(lambda: _child(serve.popen.pid, "qcluster"), timeout=30)
        cluster = _child(serve.popen.pid, "qcluster")
        # `serve` became the supervisor (exec): the standard library only, not a Django process.
        assert "-m maibot.supervisor" in _processes()[serve.popen.pid][2]
        assert _rss_mib(serve.popen.pid) < 30, _rss_mib(serve.popen.pid)
        # It sleeps until a child ends or a signal comes: blocked in select with no timeout (a 0.2 s tick
        # would sleep in clock_nanosleep, or select with one).
        assert wait_for(lambda: _waits_without_timeout(serve.popen.pid), timeout=10), _syscall(serve.popen.pid)
        # The cluster's sentinel, workers and monitor share its process group.
        assert wait_for(lambda: len(_group(cluster)) >= 3, timeout=30), _group(cluster)
        old_group = _group(cluster)

        os.kill(cluster, signal.SIGKILL)

        assert wait_for(lambda: not (_group(cluster) & old_group), timeout=20), "the dead cluster's workers live on"
        assert wait_for(lambda: (_child(serve.popen.pid, "qcluster") or cluster) != cluster, timeout=20)
        assert _child(serve.popen.pid, "daphne") == web and _answers(login)
        assert wait_for(
            lambda: LogEntry.objects.filter(
                process="supervisor", message__contains="cluster killed by SIGKILL"
            ).exists()
        ), serve.output()
        new_cluster = _child(serve.popen.pid, "qcluster")
        assert wait_for(lambda: len(_group(new_cluster)) >= 3, timeout=30)
        started = _group(new_cluster) | _group(web)

        assert serve.stop(signal.SIGTERM, timeout=60) == 0, serve.output()
        assert "maibot stopped" in serve.output()
        # Proc.stop kills what outlives a stopped process, and says what it had to kill.
        assert not serve.outlived, f"processes of serve outlived it: {serve.outlived}"
        assert not (set(_processes()) & started), "processes of serve outlived it"
    finally:  # after a failure too: a SIGKILLed supervisor would leave its children behind
        serve.stop(signal.SIGTERM, timeout=60)


@pytest.mark.long
async def test_a_web_child_killed_while_handing_over_leaves_its_claims_to_its_successor(tmp_path, make_session):
    from django.utils import timezone

    platform = "qq-serve-kill"
    port = free_port()
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"), LOG_LEVEL="INFO")
    serve = Proc([sys.executable, "manage.py", "serve", "--port", str(port)], env, tmp_path / "serve.log")
    adapter = None
    n = 300
    try:
        base = f"http://127.0.0.1:{port}"
        assert await asyncio.to_thread(wait_for, lambda: _answers(f"{base}/admin/login/"), 60), serve.output()
        assert await asyncio.to_thread(serve.wait_for_output, "dispatcher started", 60) is None
        web = _child(serve.popen.pid, "daphne")
        sessions = [await db(make_session, platform=platform) for _ in range(20)]
        adapter = await NapCatStandIn(base, platform=platform).start()
        warm = await db(message_send, session=sessions[0], source_kind="proactive", text="warm-up")
        await wait_for_async(
            lambda: Message.objects.filter(pk=warm.pk, delivery_status="delivered").exists(), what="the warm-up"
        )

        due = timezone.now() + timedelta(seconds=2)
        await db(
            lambda: ScheduledMessage.objects.bulk_create(
                ScheduledMessage(
                    session=sessions[i % len(sessions)],
                    chat_type="private",
                    message_text=f"burst {i}",
                    send_at=due,
                    due_at=due,
                    created_via=Actor.SYSTEM,
                )
                for i in range(n)
            )
        )
        await db(dispatchers_wake)  # a raw write wakes no dispatcher (the services do): as a service would
        claimer, killed_at, left = await db(kill_while_claimed, platform, web)
        assert await db(heartbeat_name, claimer) == f"{socket.gethostname()}:{web}", "not the web child's claim"
        assert left, "the web child's claim ended before the kill landed: nothing was tested"

        burst = Message.objects.filter(session__platform=platform, text__startswith="burst ")
        await wait_for_async(
            lambda: burst.filter(delivery_status="delivered").count() == n, timeout=60, what="the burst delivered"
        )
        successor = _child(serve.popen.pid, "daphne")
        assert successor not in (None, web), "serve did not restart its web child"
        moved = await db(lambda: AdapterConnection.objects.filter(platform=platform).latest("connected_at"))
        left_texts = await db(lambda: list(Message.objects.filter(pk__in=left).values_list("text", flat=True)))
    finally:
        if adapter is not None:
            await adapter.stop()
        serve.stop(signal.SIGTERM, timeout=60)

    texts = [f"burst {i}" for i in range(n)]
    first, twice = check_arrivals_after_kill(adapter.napcat.delivered, texts, moved=moved.connected_at.timestamp())
    lateness = {t: at - due.timestamp() for t, at in first.items()}
    print(
        f"\nweb child killed {killed_at - due.timestamp():.2f} s after the due time holding {len(left)} claimed rows; "
        f"the adapter back on its successor {moved.connected_at.timestamp() - killed_at:.2f} s after the kill; those "
        f"rows arrived {min(lateness[t] for t in left_texts):.2f}-{max(lateness[t] for t in left_texts):.2f} s after "
        f"their due time; {len(twice)} twice (written by the dead child, echo lost)"
    )
    # The successor starts in seconds and the adapter comes back by its own backoff; the claims are
    # free 8 s after the death (the heartbeat), never 60 s (the lease).
    assert max(lateness.values()) <= 30, sorted(lateness.values())[-5:]


def test_a_taken_port_stops_serve_at_once_naming_the_port_and_the_fix(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"))
        serve = Proc([sys.executable, "manage.py", "serve", "--port", str(port)], env, tmp_path / "serve.log")
        try:
            code = serve.popen.wait(timeout=60)
        finally:
            serve.stop(signal.SIGTERM, timeout=60)
    out = serve.output()
    assert code == 1, out
    assert f"port {port} is in use on 127.0.0.1" in out, out
    assert f"ss -ltnp 'sport = :{port}'" in out and f"--port {port + 1}" in out, out
    assert "maibot is starting" not in out, "children were started on a taken port"
    assert LogEntry.objects.filter(process="supervisor", message__contains=f"port {port} is in use").exists()


@pytest.mark.long
def test_a_port_taken_while_the_web_child_was_down_stops_everything_instead_of_restarting_forever(tmp_path):
    port = free_port()
    env = subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"))
    serve = Proc([sys.executable, "manage.py", "serve", "--port", str(port)], env, tmp_path / "serve.log")
    holder = socket.socket()
    # As servers bind: the connections of the dead server that wait in TIME_WAIT do not keep it off the port.
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        assert wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), timeout=60), serve.output()
        web = _child(serve.popen.pid, "daphne")
        assert wait_for(lambda: _child(serve.popen.pid, "qcluster"), timeout=30)
        started = _group(web) | _group(_child(serve.popen.pid, "qcluster"))

        os.kill(web, signal.SIGKILL)

        def take() -> bool:
            try:
                holder.bind(("127.0.0.1", port))
            except OSError:
                return False
            holder.listen()
            return True

        assert wait_for(take, timeout=10), "the dead web child's port never came free"
        assert serve.popen.wait(timeout=60) == 1, serve.output()
    finally:
        holder.close()
        serve.stop(signal.SIGTERM, timeout=60)  # a SIGKILLed supervisor would leave its children behind
    out = serve.output()
    assert f"port {port} is in use on 127.0.0.1" in out, out
    # At most the one restart that found the port taken (if the death was seen before the port was), never more.
    assert out.count("restarting in") <= 1, out
    assert not (set(_processes()) & started), "processes of serve outlived it"
