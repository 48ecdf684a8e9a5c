"""The console in the browser's language, and the operator's own choice remembered: headless Chromium set
to Simplified Chinese or English against a real daphne (screenshots of the dashboard in both)."""

from __future__ import annotations

import shutil

import pytest
from django.contrib.auth.models import User

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

PAGES = {
    "zh-CN": {"lang": "zh-hans", "tab": "仪表盘", "health": "健康状态", "next_due": "即将到期", "login": "登录"},
    "en-US": {"lang": "en", "tab": "Dashboard", "health": "Health", "next_due": "Next due", "login": "Log in"},
}


@pytest.fixture
def operator(transactional_db) -> User:
    return User.objects.create_superuser("op", password="pw-123456")


def log_in(page, base: str, button: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "pw-123456")
    page.click(f"input[type=submit][value='{button}']")
    page.wait_for_url(f"{base}/admin/console/")  # the login lands on the dashboard


@pytest.mark.parametrize("language", PAGES)
def test_the_dashboard_speaks_the_browsers_language(shared_server, operator, browser, tmp_path, language):
    _, base = shared_server
    texts = PAGES[language]
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=language)
    page = context.new_page()
    page.set_default_timeout(20_000)
    log_in(page, base, texts["login"])
    assert page.get_attribute("html", "lang") == texts["lang"]
    assert page.inner_text(".console-tabs li:first-child") == texts["tab"]
    assert page.inner_text("#health h2") == texts["health"]
    assert page.inner_text("#next-due h2") == texts["next_due"]
    shot = tmp_path / f"dashboard-{language}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, f"/tmp/maibot-console-dashboard-{language}.png")
    context.close()


def test_the_operators_choice_beats_the_browsers_and_is_remembered(shared_server, operator, browser):
    _, base = shared_server
    context = browser.new_context(locale="zh-CN")
    page = context.new_page()
    page.set_default_timeout(20_000)
    log_in(page, base, PAGES["zh-CN"]["login"])
    assert page.inner_text("#health h2") == "健康状态"

    page.select_option("#language-select", "en")
    page.wait_for_function("document.documentElement.lang === 'en'")
    assert page.url == f"{base}/admin/console/"  # back on the page it was chosen on
    assert page.inner_text("#health h2") == "Health"
    page.goto(f"{base}/admin/models/")
    assert page.inner_text(".console-tabs li:first-child") == "Dashboard"  # still English: remembered

    page.select_option("#language-select", "zh-hans")
    page.wait_for_function("document.documentElement.lang === 'zh-hans'")
    assert page.inner_text(".console-tabs li:first-child") == "仪表盘"
    context.close()
