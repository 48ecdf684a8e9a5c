"""Cross-process outbox wake-ups on the embedded default (chat.wake): the endpoints and their
directory, and a write in another process reaching the adapter without waiting for the poll."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from chat.gateway.gateway import get_gateway
from chat.wake import WakeEndpoint, wake_local
from core.config import override
from tests.chat.gateway_helpers import TIMEOUT, adapter
from tests.conftest import db, subprocess_env, wait_for_async

# Far longer than the test waits for the frame: a delivery within the test came from a wake-up.
POLL = 60.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bind_in(directory, name: str) -> socket.socket:
    """A datagram socket bound in `directory` (through its descriptor: the path may be long)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)
    return sock


async def test_an_endpoint_is_private_woken_without_data_and_stale_endpoints_are_removed(tmp_path):
    # Longer than a socket address holds: reached through the directory's descriptor.
    directory = tmp_path / ("d" * 60) / ("x" * 60)
    directory.mkdir(parents=True)
    directory.chmod(0o755)  # explicitly: the process umask (077) would make it private already
    # A process that died without removing its endpoint (SIGKILL): the file stays, nobody reads it.
    _bind_in(directory, "999999-dead.sock").close()
    assert (directory / "999999-dead.sock").exists()
    woken = asyncio.Event()
    endpoint = WakeEndpoint(woken.set, directory=directory)
    assert endpoint.open(asyncio.get_running_loop())
    try:
        assert len(str(endpoint.path)) > 107
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(endpoint.path.stat().st_mode) == 0o600
        # Opening probed the directory: the dead endpoint is gone.
        assert sorted(p.name for p in directory.iterdir()) == [endpoint.name]
        # This process's own endpoint is not sent to: its writes wake its deliverer directly.
        assert wake_local(directory=directory) == 0
        assert not woken.is_set()

        # Another process's endpoint is (here: a bound socket this process does not own as an endpoint).
        other = _bind_in(directory, "424242-other.sock")
        try:
            assert wake_local(directory=directory) == 1
            assert other.recv(64) == b"!"
        finally:
            other.close()
        # Once its process is gone, the next wake removes it.
        assert wake_local(directory=directory) == 0
        assert sorted(p.name for p in directory.iterdir()) == [endpoint.name]

        # A wake: a datagram, whatever it holds, means "look now"; many sent together coalesce.
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            for _ in range(5):
                sender.sendto(b"anything", f"/proc/self/fd/{fd}/{endpoint.name}")
        finally:
            sender.close()
            os.close(fd)
        await asyncio.wait_for(woken.wait(), TIMEOUT)
        assert 1 <= endpoint.received <= 5
    finally:
        endpoint.close()
    assert not endpoint.path.exists()


@pytest.mark.django_db(transaction=True)
async def test_an_outbox_write_in_another_process_reaches_the_adapter_without_waiting_for_the_poll(app, make_session):
    session = await db(make_session)
    with override(gateway={"outbox_poll_seconds": POLL, "outbox_poll_seconds_with_redis": POLL}):
        comm = adapter(app)
        assert (await comm.connect(timeout=TIMEOUT))[0]
        try:
            # The connection's own wake-up has run its round: from here on only the poll or a wake.
            deliverer = get_gateway().deliverer
            await wait_for_async(lambda: deliverer.rounds >= 1, what="the first round")
            polled_at = time.monotonic()
            code = (
                "import django; django.setup()\n"
                "from chat.models import ChatSession\n"
                "from chat.services import message_send\n"
                f"message_send(session=ChatSession.objects.get(pk={session.pk}), source_kind='proactive',"
                " text='from another process')\n"
            )
            writer = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                code,
                cwd=ROOT,
                env=subprocess_env(DJANGO_SETTINGS_MODULE="maibot.settings", LOG_LEVEL="WARNING"),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            output, _ = await writer.communicate()
            assert writer.returncode == 0, output.decode()
            # Generous for a loaded machine, yet well inside the poll interval.
            frame = await comm.receive_json_from(timeout=POLL / 3)
            assert time.monotonic() - polled_at < POLL
        finally:
            await comm.disconnect(timeout=TIMEOUT)
    assert frame["message_segment"] == {"type": "seglist", "data": [{"type": "text", "data": "from another process"}]}
