"""`manage.py serve` supervises: a SIGKILLed cluster is restarted (its orphaned workers killed) while the
ASGI server keeps serving, the restart is in the console's log, and on stop no process it started is left."""

from __future__ import annotations

import os
import signal
import sys
import urllib.request
from pathlib import Path

import pytest

from maibot.models import LogEntry
from tests.conftest import Proc, free_port, subprocess_env, wait_for

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
        assert not (set(_processes()) & started), "processes of serve outlived it"
    finally:
        serve.stop(signal.SIGKILL)
