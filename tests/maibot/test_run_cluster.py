"""`manage.py run_cluster`'s pieces, in-process: the servers' command line behind the balancer, the
balancer's variables, the refusal without haproxy. The processes themselves run in
tests/maibot/test_cluster_faults.py (live)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from maibot.management.commands import run_cluster
from maibot.management.commands.serve import daphne_argv


def test_servers_behind_the_balancer_trust_only_the_balancer_for_the_client_address():
    assert run_cluster.web_server_env() == {"MAIBOT_TRUSTED_PROXIES": "127.0.0.1"}
    # daphne's own --proxy-headers would believe the left-most X-Forwarded-For entry from anyone.
    assert "--proxy-headers" not in daphne_argv("127.0.0.1", 8000, keepalive_seconds=30)


def test_balancer_variables_name_every_server():
    env = run_cluster.haproxy_env("0.0.0.0:8000", ["127.0.0.1:8001", "127.0.0.1:8002"])
    assert env == {"MAIBOT_LB_BIND": "0.0.0.0:8000", "MAIBOT_WEB1": "127.0.0.1:8001", "MAIBOT_WEB2": "127.0.0.1:8002"}
    text = run_cluster.HAPROXY_CONFIG.read_text()
    for name in env:
        assert f'"${{{name}}}"' in text


def test_the_balancer_replaces_forwarded_for_instead_of_appending():
    """A client's own X-Forwarded-For must never reach the servers (it could claim to be loopback)."""
    lines = [line.strip() for line in run_cluster.HAPROXY_CONFIG.read_text().splitlines()]
    assert "http-request set-header X-Forwarded-For %[src]" in lines
    assert "http-request set-header X-Forwarded-Proto %[ssl_fc,iif(https,http)]" in lines
    assert "option forwardfor" not in lines


def test_run_cluster_refuses_to_start_without_haproxy(monkeypatch):
    monkeypatch.setattr(run_cluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(run_cluster.os.path, "exists", lambda path: False)
    with pytest.raises(CommandError, match="haproxy is not installed"):
        call_command("run_cluster")
