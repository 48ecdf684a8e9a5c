"""The console pages in headless Chromium against a real daphne server (and a real qcluster for logs):
the config editor's errors and save, the dashboard's charts (with a screenshot), the live log page."""

from __future__ import annotations

import shutil
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from chat.models import AdapterConnection, LLMCall
from tests.conftest import CHROMIUM_ARGS, require_chromium

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]


@pytest.fixture
def browser():
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def operator(transactional_db) -> User:
    # Made before the browser starts: sync playwright runs an event loop in this thread, after which
    # Django refuses ORM calls here.
    return User.objects.create_superuser("op", password="pw-123456")


@pytest.fixture
def page(operator, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    context.close()


def log_in(page, base: str, next_url: str) -> None:
    page.goto(f"{base}/admin/login/?next={next_url}")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-123456")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}{next_url}")


def test_config_editor_in_the_browser(start_server, page, tmp_path):
    _, base = start_server()
    config_file = tmp_path / "data-web" / "bot_config.toml"
    log_in(page, base, "/admin/config/")
    before = config_file.read_text(encoding="utf-8")

    page.fill("#id_chat__max_rounds", "0")
    page.fill("#id_bot__nickname", "浏览器 browser")
    page.click("input[name=_save]")
    page.wait_for_selector("text=Nothing was saved")
    page.screenshot(path="/tmp/maibot-console-config.png")
    assert "greater than or equal to 1" in page.inner_text(".field-chat__max_rounds .errorlist")
    assert page.input_value("#id_bot__nickname") == "浏览器 browser"  # the operator's input is kept
    assert config_file.read_text(encoding="utf-8") == before

    page.fill("#id_chat__max_rounds", "6")
    page.click("input[name=_save]")
    page.wait_for_selector("text=Saved and applied")
    after = config_file.read_text(encoding="utf-8")
    assert 'nickname = "浏览器 browser"' in after and "max_rounds = 6" in after
    assert "# Tool-call rounds per cycle before it must end." in after
    assert page.input_value("#id_chat__max_rounds") == "6"

    # A model, its budget and a quiet-hours rule in the tables, as the operator types them.
    page.fill("input[name='llm__models-0-name']", "backup")
    page.fill("input[name='llm__models-0-model']", "deepseek-chat")
    page.select_option("select[name='llm__budgets-0-scope']", "model")
    page.fill("input[name='llm__budgets-0-target']", "backup")
    page.fill("input[name='llm__budgets-0-daily_cost']", "1.5")
    page.fill("input[name='chat__talk_frequency_rules-0-end']", "08:00")
    page.fill("input[name='chat__talk_frequency_rules-0-talk_frequency']", "0")
    page.click("input[name=_save]")
    page.wait_for_selector("text=Saved and applied")
    page.locator("#section-llm").screenshot(path="/tmp/maibot-console-config-tables.png")
    after = config_file.read_text(encoding="utf-8")
    assert '[[llm.models]]\nname = "backup"\nmodel = "deepseek-chat"' in after, after
    assert 'scope = "model"' in after and "daily_cost = 1.5" in after and 'end = "08:00"' in after
    assert page.input_value("input[name='llm__models-0-name']") == "backup"

    # The raw view refuses an invalid text and keeps the file.
    page.click("text=Configuration (TOML)")
    page.fill("textarea[name=toml]", after.replace("max_rounds = 6", "max_rounds = many"))
    page.click("input[name=_save]")
    page.wait_for_selector("#config-raw-error")
    assert "not valid TOML" in page.inner_text("#config-raw-error")
    assert config_file.read_text(encoding="utf-8") == after


@pytest.fixture
def dashboard_data(transactional_db, make_session) -> None:
    now = timezone.now()
    AdapterConnection.objects.create(platform="qq", protocol="ws")
    for day, model, tokens in [
        (0, "gpt-mini", 3000),
        (1, "gpt-mini", 1000),
        (1, "deepseek-chat", 5000),
        (3, "gpt-mini", 2000),
    ]:
        call = LLMCall.objects.create(
            purpose="planner", model=model, prompt_tokens=tokens, completion_tokens=tokens // 3, cost=Decimal("0.01")
        )
        LLMCall.objects.filter(pk=call.pk).update(created_at=now - timedelta(days=day))
    from scheduling.dispatcher import deliver_due
    from scheduling.models import ScheduledMessage
    from scheduling.services import SYSTEM, scheduled_message_create

    for lateness in (0.1, 0.4, 2.0):
        task = scheduled_message_create(
            session=make_session(), send_at=now + timedelta(hours=1), message_text="hi", acted_by=SYSTEM
        ).task
        ScheduledMessage.objects.filter(pk=task.pk).update(
            send_at=now - timedelta(seconds=lateness), due_at=now - timedelta(seconds=lateness)
        )
    assert deliver_due().sent == 3
    from chat.models import Message

    Message.objects.create(
        session=make_session(platform="wechat"), direction="in", source_kind="user", text="hi", time=now
    )


def test_dashboard_charts_render(dashboard_data, shared_server, page, tmp_path):
    _, base = shared_server
    log_in(page, base, "/admin/console/")
    charts = page.query_selector_all("svg.chart")
    assert len(charts) == 6  # messages received and sent, lateness twice, LLM tokens and cost
    for chart in charts:
        box = chart.bounding_box()
        assert box["width"] > 300 and box["height"] > 150
        assert len(chart.query_selector_all("rect, path")) > 0
    usage = page.query_selector("#llm-usage svg.chart")
    bars = [r for r in usage.query_selector_all("rect") if (r.bounding_box() or {}).get("height", 0) > 1]
    assert len(bars) >= 4 + 2  # four day/model bars plus the two legend swatches
    assert "no data yet" not in page.inner_text("#llm-usage")
    received, sent = page.query_selector_all("#message-volume svg.chart")
    assert "wechat" in received.inner_html() and "qq" in sent.inner_html()
    lateness_lines = page.query_selector_all("#lateness svg.chart path")
    assert len(lateness_lines) == 2  # p50 and p99 over the hours
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, "/tmp/maibot-console-dashboard.png")


def test_live_log_page_shows_cluster_lines_with_pause_and_level_filter(start_server, start_qcluster, page, tmp_path):
    _, base = start_server()
    start_qcluster("q1")
    cluster_config = tmp_path / "data-q1" / "bot_config.toml"
    log_in(page, base, "/admin/logs/")

    page.wait_for_selector("#log-lines div:has-text('dispatcher started')")
    assert "[cluster]" in page.inner_text("#log-lines div:has-text('dispatcher started')")

    text = cluster_config.read_text(encoding="utf-8")
    cluster_config.write_text(text.replace('nickname = "麦麦"', 'nickname = "one"'), encoding="utf-8")
    page.wait_for_selector("#log-lines div:has-text('changed: bot.nickname')")

    # Paused: new lines are held back (and counted), then shown on resume.
    page.click("#log-pause")
    cluster_config.write_text(text.replace('nickname = "麦麦"', 'nickname = "two"'), encoding="utf-8")
    page.wait_for_function("document.getElementById('log-status').textContent.includes('new')")
    assert page.locator("#log-lines div:has-text('changed: bot.nickname')").count() == 1
    page.click("#log-pause")
    page.wait_for_function(
        "document.querySelectorAll('#log-lines div').length > 0 && "
        "[...document.querySelectorAll('#log-lines div')].filter(d => d.textContent.includes('changed: bot.nickname'))"
        ".length === 2"
    )

    # Level filter: ERROR and above only.
    page.select_option("#log-level", "40")
    page.wait_for_function("document.querySelectorAll('#log-lines div.INFO').length === 0", timeout=10_000)
    cluster_config.write_text("[chat]\nmax_rounds = 0\n", encoding="utf-8")
    page.wait_for_selector("#log-lines div.ERROR:has-text('reload rejected')")
    assert page.locator("#log-lines div.INFO").count() == 0
    page.screenshot(path=str(tmp_path / "logs.png"))
    shutil.copy(tmp_path / "logs.png", "/tmp/maibot-console-logs.png")
