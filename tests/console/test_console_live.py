"""The console against real processes: a line logged in a real qcluster reaches the live log websocket of a
real daphne server; the cluster's heartbeat makes /healthz healthy and its stop makes it unhealthy."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from core.config import get_config
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]


def operator_cookie() -> str:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return f"sessionid={client.cookies['sessionid'].value}"


def receive_until(ws, predicate, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        except TimeoutError:
            break
        for line in frame.get("lines", []):
            if predicate(line):
                return line
    raise AssertionError("the expected log line did not arrive")


def healthz(base: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_line_logged_in_the_cluster_reaches_the_live_log_websocket(start_server, start_qcluster, tmp_path):
    _, base = start_server()
    cluster = start_qcluster("q1")
    ws_url = base.replace("http://", "ws://") + "/ws/admin/logs/"

    with connect(ws_url, origin=base, additional_headers={"Cookie": operator_cookie()}) as ws:
        # The backlog already holds the cluster's start-up lines.
        started = receive_until(ws, lambda line: "dispatcher started" in line["message"])
        assert started["process"] == "cluster" and started["level"] == "INFO"
        assert started["logger"] == "scheduling.dispatcher" and started["module"] == "dispatcher"
        offset = datetime.now(get_config().tzinfo).isoformat()[-6:]
        assert started["line"] > 0 and started["time"].endswith(offset)  # shown in the bot's time zone

        # Now make the cluster log something new: edit its config file; its watcher reloads it.
        path = tmp_path / "data-q1" / "bot_config.toml"
        path.write_text(path.read_text(encoding="utf-8").replace('nickname = "麦麦"', 'nickname = "集群 cluster"'))
        line = receive_until(ws, lambda line: "changed: bot.nickname" in line["message"])
        assert line["process"] == "cluster" and line["logger"] == "core.reload"
        assert "reloaded" in cluster.output()

        # Level filter: only warnings and above from now on; an invalid edit logs an ERROR.
        ws.send(json.dumps({"type": "level", "min_level": 30}))
        path.write_text("[chat]\nmax_rounds = 0\n", encoding="utf-8")
        line = receive_until(ws, lambda line: "reload rejected" in line["message"])
        assert line["level"] == "ERROR" and line["process"] == "cluster"
        assert "chat.max_rounds" in line["message"]


def test_the_log_websocket_refuses_visitors_and_other_sites(shared_server):
    _, base = shared_server
    ws_url = base.replace("http://", "ws://") + "/ws/admin/logs/"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, origin=base)
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus):
        connect(ws_url, origin="http://evil.example", additional_headers={"Cookie": operator_cookie()})


@pytest.mark.long
def test_healthz_follows_the_cluster_heartbeat(start_server, start_qcluster):
    _, base = start_server()
    status, body = healthz(base)
    assert status == 503 and body["checks"]["cluster"]["ok"] is False

    cluster = start_qcluster("q1")
    assert wait_for(lambda: healthz(base)[0] == 200, interval=0.2)

    assert cluster.stop() == 0
    status, body = healthz(base)
    assert status == 503 and body["checks"]["cluster"]["last_heartbeat"] is None


def test_the_server_serves_the_admin_and_console_assets_itself(shared_server):
    # No separate web server and no CDN: the admin's CSS comes from daphne.
    _, base = shared_server
    with urllib.request.urlopen(f"{base}/static/admin/css/base.css", timeout=10) as resp:
        assert resp.status == 200
        assert b"body" in resp.read()


def test_the_server_follows_edits_of_its_own_config_file(start_server, tmp_path):
    from core.models import LogEntry, ProcessHeartbeat

    _, base = start_server()
    healthz(base)  # the first request starts the server's console services
    assert wait_for(lambda: ProcessHeartbeat.objects.filter(role="web").exists())
    assert wait_for(lambda: LogEntry.objects.filter(process="web", message__startswith="watching").exists()), (
        "the server's config watcher did not start"
    )

    path = tmp_path / "data-web" / "bot_config.toml"
    path.write_text(path.read_text(encoding="utf-8").replace('nickname = "麦麦"', 'nickname = "服务器 server"'))
    assert wait_for(
        lambda: LogEntry.objects.filter(process="web", message__contains="changed: bot.nickname").exists()
    ), "the server did not reload its config"
    request = urllib.request.Request(f"{base}/admin/config/", headers={"Cookie": operator_cookie()})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert 'value="服务器 server"' in resp.read().decode()


def test_a_line_logged_in_a_cluster_worker_task_is_stored(start_qcluster, monkeypatch):
    from django_q.conf import Conf
    from django_q.tasks import async_task

    from core.models import LogEntry

    cluster = start_qcluster("q1")
    # To the test cluster's own queue, signed with its name as the salt (start_qcluster: test-<pid>).
    monkeypatch.setattr(Conf, "PREFIX", f"test-{os.getpid()}")
    async_task("tests.console_tasks.log_line", "来自工作进程 from a worker", cluster=f"test-{os.getpid()}")
    assert wait_for(lambda: LogEntry.objects.filter(message="来自工作进程 from a worker").exists(), timeout=30), (
        cluster.output()
    )
    entry = LogEntry.objects.get(message="来自工作进程 from a worker")
    assert entry.process == "cluster" and entry.level_name == "WARNING"
    assert entry.pid != cluster.popen.pid  # written by the worker process itself
