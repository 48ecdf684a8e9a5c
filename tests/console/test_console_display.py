"""What the console shows is what is true: a scheduled message's history as a table, an error as an error,
every time in the bot's time zone in one format with its offset, the next due message first, no "OK" next
to "No adapter is connected", only running processes, and no start-up /healthz 503 as a recent error."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat.models import LLMCall, PlannerCycle
from core import config as bot_config
from core.models import ProcessHeartbeat
from scheduling.models import ScheduledMessage, ScheduledStatus
from scheduling.services import SYSTEM, scheduled_message_create, scheduled_message_reschedule

pytestmark = pytest.mark.django_db

# The server's TIME_ZONE is Asia/Shanghai (+0800): the bot's differs, so a time shown in the wrong zone shows.
BOT_ZONE = "America/New_York"
# Any time a page may show: ISO-like, or Django's English defaults ("8 a.m.", "Dec. 24, 2026").
ANY_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}|\b\d{1,2}(:\d{2})? [ap]\.m\.|\b[A-Z][a-z]{2}\.? \d{1,2}, \d{4}"
)
SHOWN_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [+-]\d{4}")


@pytest.fixture
def bot_zone():
    with bot_config.override(bot={"time_zone": BOT_ZONE}):
        yield ZoneInfo(BOT_ZONE)


def page_text(html: str) -> str:
    """What a reader sees: the page without its tags, scripts and styles (form inputs carry times as typed)."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def assert_one_time_format(html: str, zone: ZoneInfo) -> list[str]:
    """Every time on the page is `YYYY-MM-DD HH:MM:SS ±hhmm` with the bot zone's offset; returns them."""
    text = page_text(html)
    found = [m.group(0) for m in ANY_TIME.finditer(text)]
    shown = SHOWN_TIME.findall(text)
    assert found and len(found) == len(shown), f"times in other formats: {sorted(set(found) - set(shown))}"
    offsets = {t[-5:] for t in shown}
    now_offset = timezone.now().astimezone(zone).strftime("%z")
    assert offsets <= {now_offset, (timezone.now() + timedelta(days=200)).astimezone(zone).strftime("%z")}
    return shown


def schedule(session, *, hours: float, text: str = "hello") -> ScheduledMessage:
    when = timezone.now() + timedelta(hours=hours)
    return scheduled_message_create(session=session, send_at=when, message_text=text, acted_by=SYSTEM).task


def test_scheduled_message_history_is_a_table_not_escaped_html(operator, make_session):
    task = schedule(make_session(), hours=2)
    scheduled_message_reschedule(task_id=task.pk, send_at=timezone.now() + timedelta(hours=3), acted_by=SYSTEM)
    html = operator.get(reverse("admin:scheduling_scheduledmessage_change", args=[quote(task.pk)])).content.decode()
    assert "&lt;tr&gt;" not in html  # the rows are markup, not text showing markup
    history = html.split('<table class="history">', 1)[1].split("</table>", 1)[0]
    assert history.count("<tr><td>") == 2
    assert "<td>created</td>" in history and "<td>rescheduled</td>" in history


def test_scheduled_message_page_shows_every_time_in_the_bot_zone_in_one_format(operator, make_session, bot_zone):
    task = schedule(make_session(), hours=30)
    scheduled_message_reschedule(task_id=task.pk, send_at=task.send_at + timedelta(hours=1), acted_by=SYSTEM)
    task.refresh_from_db()
    html = operator.get(reverse("admin:scheduling_scheduledmessage_change", args=[quote(task.pk)])).content.decode()
    shown = assert_one_time_format(html, bot_zone)
    expected = task.send_at.astimezone(bot_zone).strftime("%Y-%m-%d %H:%M:%S %z")
    title = re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    assert expected in title  # the title too, not the UTC time
    assert expected in shown
    # created, rescheduled (and its old and new times) and the audit fields are all there, all alike.
    assert len(shown) >= 6


def test_scheduled_list_shows_the_next_due_first_then_the_rest_newest_first(operator, make_session):
    session = make_session()
    later, soon, middle = (schedule(session, hours=h) for h in (3, 1, 2))
    old_failed, older_cancelled = schedule(session, hours=5), schedule(session, hours=6)
    ScheduledMessage.objects.filter(pk=old_failed.pk).update(
        status=ScheduledStatus.FAILED, last_error="adapter_offline", send_at=timezone.now() - timedelta(days=1)
    )
    ScheduledMessage.objects.filter(pk=older_cancelled.pk).update(
        status=ScheduledStatus.CANCELLED, cancelled_at=timezone.now(), send_at=timezone.now() - timedelta(days=2)
    )
    html = operator.get(reverse("admin:scheduling_scheduledmessage_changelist")).content.decode()
    rows = re.findall(r'name="_selected_action" value="([^"]+)"', html)
    assert rows == [soon.pk, middle.pk, later.pk, old_failed.pk, older_cancelled.pk]


def test_planner_cycle_and_llm_call_errors_show_as_errors(operator, make_session):
    session = make_session()
    now = timezone.now()
    PlannerCycle.objects.create(session=session, started_at=now, action="reply")
    PlannerCycle.objects.create(
        session=session, started_at=now, action="", error="AuthenticationError: Error code: 401 - invalid key"
    )
    LLMCall.objects.create(purpose="planner", model="m", error="AuthenticationError: Error code: 401")
    LLMCall.objects.create(purpose="planner", model="m")
    for url in (reverse("admin:chat_plannercycle_changelist"), reverse("admin:chat_llmcall_changelist")):
        html = operator.get(url).content.decode()
        cells = re.findall(r'<td class="field-has_error">(.*?)</td>', html, re.S)
        assert len(cells) == 2 and not any("<img" in cell for cell in cells)  # no green tick for an error
        badges = [re.search(r'<span class="mb-badge" title="([^"]*)"[^>]*>error</span>', c) for c in cells]
        assert sorted(bool(b) for b in badges) == [False, True]
        assert "Error code: 401" in next(b for b in badges if b).group(1)


@pytest.fixture
def cluster_alive(db) -> None:
    now = timezone.now()
    ProcessHeartbeat.objects.create(
        instance="live1",
        name="host:101",
        role="cluster",
        started_at=now,
        beat_at=now,
        alive_until=now + timedelta(minutes=1),
    )


def test_dashboard_does_not_call_no_adapter_ok(operator, cluster_alive):
    html = operator.get("/admin/console/").content.decode()
    adapters = page_text(html.split('class="health-adapters"', 1)[1].split("</tr>", 1)[0])
    assert "No adapter connected" in adapters and "OK" not in adapters


def test_dashboard_lists_only_running_processes_in_one_time_format(operator, cluster_alive, bot_zone):
    now = timezone.now()
    ProcessHeartbeat.objects.create(  # died two minutes ago without saying goodbye
        instance="dead1",
        name="host:202",
        role="web",
        started_at=now - timedelta(hours=1),
        beat_at=now - timedelta(minutes=2),
        alive_until=now - timedelta(minutes=1),
    )
    html = operator.get("/admin/console/").content.decode()
    processes = html.split('id="processes"', 1)[1].split("</table>", 1)[0]
    assert "host:101" in processes and "host:202" not in processes
    assert_one_time_format(html, bot_zone)


def test_an_unhealthy_healthz_is_not_logged_as_a_server_error(db, caplog):
    with caplog.at_level(logging.INFO, logger="django.request"):
        assert Client().get("/healthz").status_code == 503  # no cluster heartbeat yet: start-up
        assert Client().get("/no-such-page").status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert lines == ["Not Found: /no-such-page"]  # other answers are still logged


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_admins_date_format_is_the_consoles(language):
    from django.utils import translation
    from django.utils.formats import date_format

    zone = ZoneInfo("Asia/Kolkata")  # a half-hour offset
    instant = timezone.now()
    with translation.override(language), timezone.override(zone):
        assert date_format(timezone.localtime(instant), "DATETIME_FORMAT") == bot_config.format_shown(instant, zone)
