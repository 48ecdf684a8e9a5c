"""The terminal's log lines are the bot's: no access log unless asked for, no favicon 404 on every page,
and every time with its zone's offset."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import urllib.request
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.contrib.staticfiles import finders
from django.test import Client

from core.logs import daphne_access_log_options
from maibot.management.commands.serve import daphne_argv
from tests.conftest import ROOT, Proc, free_port, subprocess_env, wait_for

LINE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3})([+-]\d{2}:\d{2}) WARNING ")


@pytest.mark.live  # a real process with the project's logging
def test_log_lines_show_the_time_with_the_zones_offset(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "import django, logging; django.setup(); logging.getLogger('probe').warning('hello')"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MAIBOT_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "maibot.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = next(line for line in result.stderr.splitlines() if line.endswith("hello"))
    found = LINE_TIME.match(line)
    assert found, line
    shown = datetime.fromisoformat(found.group(1) + found.group(2))
    zone = ZoneInfo(settings.TIME_ZONE)  # Django puts the process in TIME_ZONE
    assert found.group(2) == datetime.now(zone).isoformat()[-6:]
    assert abs((datetime.now(zone) - shown).total_seconds()) < 60


def test_runservers_access_log_is_off_by_default():
    assert settings.MAIBOT_ACCESS_LOG is False
    assert not logging.getLogger("django.channels.server").isEnabledFor(logging.INFO)
    assert logging.getLogger("django.channels.server").isEnabledFor(logging.WARNING)


@pytest.mark.live
@pytest.mark.parametrize("enabled", [False, True])
def test_the_servers_access_log_follows_the_setting(transactional_db, tmp_path, enabled):
    port = free_port()
    argv = daphne_argv("127.0.0.1", port, keepalive_seconds=15)
    proc = Proc(
        [*argv[:-1], *daphne_access_log_options(enabled), argv[-1]],
        subprocess_env(MAIBOT_DATA_DIR=str(tmp_path / "data"), MAIBOT_CONSOLE_SERVICES="0"),
        tmp_path / "daphne.log",
    )
    try:

        def answered() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        assert wait_for(answered, timeout=60), proc.output()
        for _ in range(3):
            answered()
        if enabled:
            assert wait_for(lambda: '"GET /admin/login/' in proc.output(), timeout=10), proc.output()
    finally:
        proc.stop()
    assert ('"GET /admin/login/' in proc.output()) is enabled, proc.output()


def test_favicon_is_the_consoles_icon_not_a_404(db, caplog):
    with caplog.at_level(logging.INFO, logger="django.request"):
        response = Client().get("/favicon.ico")
    assert response.status_code == 301 and response.url == "/static/maibot/favicon.svg"
    assert finders.find("maibot/favicon.svg") is not None
    assert not [r for r in caplog.records if r.name == "django.request"]
    login = Client().get("/admin/login/").content.decode()
    assert 'rel="icon"' in login and "maibot/favicon.svg" in login
