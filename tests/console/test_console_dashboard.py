"""The console dashboard (adapters, scheduled work, lateness, LLM usage, errors) and /healthz."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from chat.models import AdapterConnection, LLMCall
from console.dashboard import percentile, timer_model
from core import config as bot_config
from core.models import LogEntry, ProcessHeartbeat
from scheduling.dispatcher import deliver_due
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create


@pytest.fixture
def operator(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("op", password="pw-123456"))
    return client


def schedule(session, text, *, in_seconds=3600):
    return scheduled_message_create(
        session=session, send_at=timezone.now() + timedelta(seconds=in_seconds), message_text=text, acted_by=SYSTEM
    ).task


@pytest.fixture
def activity(db, make_session):
    """A little of everything the dashboard shows."""
    now = timezone.now()
    AdapterConnection.objects.create(platform="qq", protocol="ws", remote="127.0.0.1:5000")
    AdapterConnection.objects.create(platform="wechat", protocol="socketio")
    AdapterConnection.objects.create(platform="telegram", protocol="ws", disconnected_at=now)

    session = make_session()
    pending = [schedule(session, f"稍后 later {i}", in_seconds=600 + i) for i in range(12)]
    # Three delivered late by about 0.2 s, 1 s and 3 s through the real dispatcher round.
    for lateness in (0.2, 1.0, 3.0):
        task = schedule(make_session(), f"late by {lateness}")
        ScheduledMessage.objects.filter(pk=task.pk).update(
            send_at=now - timedelta(seconds=lateness), due_at=now - timedelta(seconds=lateness)
        )
    assert deliver_due().sent == 3
    failed = schedule(make_session(), "never made it")
    ScheduledMessage.objects.filter(pk=failed.pk).update(status=ScheduledStatus.FAILED, last_error="adapter_offline")

    for model, day, tokens, cost, error in [
        ("gpt-mini", 0, 1200, "0.0012", ""),
        ("gpt-mini", 1, 800, "0.0008", ""),
        ("deepseek-chat", 0, 5000, "0.0100", ""),
        ("deepseek-chat", 2, 100, "0", "RateLimitError: 429 slow down"),
    ]:
        call = LLMCall.objects.create(
            purpose="planner",
            model=model,
            prompt_tokens=tokens // 2,
            completion_tokens=tokens // 2,
            cost=Decimal(cost),
            error=error,
        )
        LLMCall.objects.filter(pk=call.pk).update(created_at=now - timedelta(days=day))
    LogEntry.objects.create(
        created_at=now,
        level=40,
        level_name="ERROR",
        logger="chat.gateway",
        module="gateway",
        line=42,
        message="adapter qq sent garbage",
        process="web",
    )
    return {"pending": pending, "failed": failed}


def test_dashboard_shows_adapters_scheduled_work_lateness_usage_and_errors(operator, activity):
    page = operator.get("/admin/console/").content.decode()

    adapters = page.split('id="adapters"', 1)[1].split('class="module"', 1)[0]
    assert "Connected adapters (2)" in adapters
    assert "qq" in adapters and "wechat" in adapters and "telegram" not in adapters

    scheduled = page.split('id="scheduled"', 1)[1].split('class="module"', 1)[0]
    figures = re.findall(r'<th scope="row">(\w+)</th><td class="console-figure">(\d+)</td>', scheduled)
    # The three the dispatcher wrote to the outbox wait there for an adapter: on their way, not sent.
    assert figures == [("Pending", "12"), ("Sending", "3"), ("Unconfirmed", "0"), ("Failed", "1")]

    next_due = page.split('id="next-due"', 1)[1].split('class="module"', 1)[0]
    # The ten due first, soonest first, each linked to its own page.
    row = r'<tr class="next-due-row"><td><a href="/admin/scheduling/scheduledmessage/(sm_\w+)/change/">'
    linked = re.findall(row, next_due)
    assert linked == [t.pk for t in activity["pending"][:10]]

    lateness = page.split('id="lateness"', 1)[1].split('id="llm-usage"', 1)[0]
    assert "Last hour: 3 sent" in lateness
    p50 = float(re.search(r"Last hour: 3 sent, p50 ([\d.]+) s", lateness).group(1))
    assert 1.0 <= p50 < 10.0  # the middle one of ~0.2 s, ~1 s, ~3 s late
    assert lateness.count('<svg class="chart"') == 2

    usage = page.split('id="llm-usage"', 1)[1].split('id="errors"', 1)[0]
    assert usage.count('<svg class="chart"') == 2
    assert "<title>gpt-mini · " in usage and "<title>deepseek-chat · " in usage
    assert "RateLimitError" not in usage  # errors are listed below, not here
    assert "<td>deepseek-chat</td><td>1</td><td>1</td>" in usage  # the failed call counted as an error

    errors = page.split('id="errors"', 1)[1]
    assert activity["failed"].pk in errors and "adapter_offline" in errors
    assert "RateLimitError: 429 slow down" in errors
    assert "adapter qq sent garbage" in errors

    timers = page.split('id="timers"', 1)[1].split('class="module"', 1)[0]
    if timer_model() is None:
        assert "not installed" in timers


def test_dashboard_renders_empty(operator):
    page = operator.get("/admin/console/")
    assert page.status_code == 200
    assert page.content.decode().count("no data yet") == 6  # lateness, LLM usage, messages received and sent


def test_console_pages_are_for_operators_only(db):
    for url in ("/admin/console/", "/admin/logs/"):
        assert Client().get(url)["Location"].startswith("/admin/login/")
    staff = User.objects.create_user("staff", password="pw-123456", is_staff=True)
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/console/").status_code == 403
    assert client.get("/admin/logs/").status_code == 403
    assert "Operator console" not in client.get("/admin/").content.decode()

    staff.user_permissions.add(Permission.objects.get(codename="view_console"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert client.get("/admin/console/").status_code == 200
    assert client.get("/admin/logs/").status_code == 200
    index = client.get("/admin/").content.decode()
    assert "/admin/console/" in index and "/admin/logs/" in index
    assert "/admin/config/" not in index  # viewing is not editing


def test_the_login_lands_on_the_dashboard_from_the_printed_address_and_elsewhere_where_it_was_sent(operator):
    """The printed "operator console" address is /admin/: its login lands on the dashboard, as a login
    with no destination does; a login sent from another page goes back there."""
    client = Client()
    to_login = client.get("/admin/")["Location"]
    assert to_login == "/admin/login/?next=/admin/"
    form = client.get(to_login).content.decode()
    assert 'name="next" value="/"' in form  # the form itself carries the dashboard's way
    for sent_to, lands in (("/admin/", "/"), ("", "/"), ("/admin/chat/message/", "/admin/chat/message/")):
        client = Client()
        response = client.post(
            f"/admin/login/?next={sent_to}", {"username": "op", "password": "pw-123456", "next": sent_to}
        )
        assert response.status_code == 302 and response["Location"] == lands, (sent_to, response)
    assert client.get("/")["Location"] == "/admin/console/"


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    values = list(range(1, 101))
    assert percentile(values, 99) == 99 and percentile(values, 50) == 50


def test_healthz_reports_database_cluster_and_adapters(db):
    client = Client()
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["cluster"] == {"ok": False, "last_heartbeat": None, "age_seconds": None}

    now = timezone.now()
    ProcessHeartbeat.objects.create(name="host:1", role="cluster", started_at=now, beat_at=now)
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    adapters = response.json()["checks"]["adapters"]
    assert adapters == {"ok": True, "connected_platforms": [], "connections": [], "required": False}

    with bot_config.override(console={"health_requires_adapter": True}):
        assert client.get("/healthz").status_code == 503
        AdapterConnection.objects.create(platform="qq", protocol="ws")
        response = client.get("/healthz")
        assert response.status_code == 200
        assert response.json()["checks"]["adapters"]["connected_platforms"] == ["qq"]

    ProcessHeartbeat.objects.update(beat_at=now - timedelta(seconds=31))
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["checks"]["cluster"]["ok"] is False
    assert "SECRET" not in json.dumps(response.json()).upper()


def test_message_volume_counts_each_platform_per_hour_of_the_bots_zone(operator, make_session):
    from chat.models import Message
    from console.dashboard import message_volume

    tz = bot_config.get_config().tzinfo  # Asia/Shanghai: its hours are not UTC's
    now = timezone.localtime(timezone.now(), tz).replace(minute=30, second=0, microsecond=0)
    qq, wechat = make_session(platform="qq"), make_session(platform="wechat")

    def message(session, direction, hours_ago, minute=0):
        at = now.replace(minute=minute) - timedelta(hours=hours_ago)
        fate = {"source_kind": "reply", "delivery_status": "pending"} if direction == "out" else {}
        Message.objects.create(
            session=session, direction=direction, text="x", time=at, **{"source_kind": "user", **fate}
        )

    for _ in range(3):
        message(qq, "in", 0)
    message(qq, "out", 0, minute=59)
    message(wechat, "in", 5, minute=1)
    message(qq, "in", 23)
    message(qq, "in", 24)  # the hour before the first shown: left out
    volume = message_volume(now)
    assert volume["hours"][-1] == now.replace(minute=0) and len(volume["hours"]) == 24
    assert volume["in"]["qq"][23] == 3 and volume["in"]["qq"][0] == 1 and sum(volume["in"]["qq"]) == 4
    assert volume["in"]["wechat"][18] == 1 and sum(volume["in"]["wechat"]) == 1
    assert volume["out"] == {"qq": [0] * 23 + [1]}

    for language, title in (("en", "Messages received per hour and platform"), ("zh-hans", "每小时各平台收到的消息")):
        page = operator.get("/admin/console/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
        panel = page.split('id="message-volume"', 1)[1].split('<div class="module', 1)[0]
        assert title in panel and "<svg" in panel and "wechat" in panel, panel[:500]


def test_count_charts_label_their_axis_with_whole_numbers():
    """A count chart's y labels are integers however small the counts (not 0, 0.25, 0.5 for one message);
    a chart of measurements keeps its fractions."""
    import re

    from console.charts import Series, _whole_max, bar_chart

    def y_labels(svg: str) -> list[str]:
        return re.findall(r'text-anchor="end"[^>]*>([^<]*)</text>', svg)

    assert [_whole_max(v) for v in (0, 1, 3, 4, 5, 7, 8, 9, 19, 21, 199, 201, 1_999)] == [
        4, 4, 4, 4, 8, 8, 8, 20, 20, 40, 200, 400, 2_000,
    ]  # fmt: skip
    for peak in (1, 3, 6, 13, 37, 950, 12_345):
        svg = bar_chart(title="t", categories=["a", "b"], series=[Series("qq", [peak, 0])], counts=True)
        labels = y_labels(svg)
        assert len(labels) == 5 and all(re.fullmatch(r"[\d,]+", label) for label in labels), (peak, labels)
        assert int(labels[-1].replace(",", "")) >= peak
    assert "0.25" in y_labels(bar_chart(title="t", categories=["a"], series=[Series("p50", [0.9])]))
