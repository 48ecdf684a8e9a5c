"""The dashboard that updates itself and the config form's search, in headless Chromium against the shared
daphne, in Simplified Chinese and in English (screenshots of both): a message stored after the page was
loaded shows up without a reload; a failed refresh keeps the panels and says since when they are old; a
hidden tab does not poll; the config search finds tool_timeout by 超时 and by timeout, and says when
nothing matches."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from chat.services import message_send, session_get_or_create
from tests.console.conftest import in_thread
from tests.console.test_console_i18n_browser import PAGES, log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

TEXTS = {
    "zh-CN": {"stale": "未更新", "none": "没有设置与搜索匹配。"},
    "en-US": {"stale": "Not updated since", "none": "No setting matches the search."},
}


def new_chat(name: str) -> None:
    session = session_get_or_create(platform="qq", chat_type="private", user_id="880088", user_nickname=name)
    message_send(session=session, source_kind="admin", text="你好")


def open_page(browser, base: str, language: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale=language)
    page = context.new_page()
    page.set_default_timeout(20_000)
    log_in(page, base, PAGES[language]["login"])
    return context, page


def screenshot(page, tmp_path, name: str) -> None:
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    shutil.copy(shot, f"/tmp/maibot-console-{name}.png")


@pytest.mark.parametrize("language", TEXTS)
def test_the_dashboard_updates_itself(shared_server, browser_operator, browser, tmp_path, language):
    _, base = shared_server
    context, page = open_page(browser, base, language)
    page.goto(f"{base}/admin/console/?refresh=1")
    page.evaluate("window.sameDocument = true")  # gone if the page were reloaded
    name = f"新朋友-{language}"
    assert name not in page.inner_text("#chats")

    in_thread(lambda: new_chat(name))
    page.wait_for_function(f"document.querySelector('#chats').innerText.includes({json.dumps(name)})")
    assert page.evaluate("window.sameDocument") is True
    assert page.is_hidden(".dashboard-stale")
    screenshot(page, tmp_path, f"dashboard-live-{language}")

    # The server stops answering (restarting): the panels stay, with a note since when they are old.
    page.route("**/admin/console/panels/**", lambda route: route.fulfill(status=503, body="restarting"))
    page.wait_for_selector(".dashboard-stale", state="visible")
    note = page.inner_text(".dashboard-stale")
    assert TEXTS[language]["stale"] in note and re.search(r"\d\d:\d\d ?[(（]Asia/Shanghai[)）]", note)
    assert name in page.inner_text("#chats")
    screenshot(page, tmp_path, f"dashboard-stale-{language}")
    page.unroute("**/admin/console/panels/**")
    page.wait_for_selector(".dashboard-stale", state="hidden")  # answered again: fresh panels, no note

    # A hidden tab does not poll; shown again, it refreshes at once.
    fetched = []
    page.on("request", lambda request: fetched.append(request.url) if "/panels/" in request.url else None)
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    fetched.clear()
    page.wait_for_timeout(3_000)  # three intervals: proving an absence takes a while
    assert fetched == []
    with page.expect_request("**/admin/console/panels/"):
        page.evaluate(
            "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
            "document.dispatchEvent(new Event('visibilitychange'))"
        )
    context.close()


@pytest.mark.parametrize("language", TEXTS)
def test_the_config_search_finds_a_field_by_a_chinese_and_an_english_word(
    shared_server, browser_operator, browser, tmp_path, language
):
    _, base = shared_server
    context, page = open_page(browser, base, language)
    page.goto(f"{base}/admin/config/")
    field, other = ".field-chat__tool_timeout", ".field-scheduling__horizon_days"
    assert page.is_visible(field) and page.is_visible(other)

    for word in ("超时", "timeout", "Tool Timeout"):
        page.fill("#config-search", word)
        page.wait_for_selector(other, state="hidden")
        assert page.is_visible(field) and page.is_hidden("#config-search-none")
        assert page.is_hidden("#section-scheduling")
        assert page.is_hidden('#config-sections li[data-section="scheduling"]')
        if word == "超时":
            screenshot(page, tmp_path, f"config-search-{language}")

    page.fill("#config-search", "没有这种设置 nothing-like-this")
    page.wait_for_selector("#config-search-none", state="visible")
    assert page.inner_text("#config-search-none") == TEXTS[language]["none"] and page.is_hidden(field)

    page.fill("#config-search", "")
    page.wait_for_selector(other, state="visible")
    assert page.is_visible(field) and page.is_hidden("#config-search-none")
    page.click('#config-sections a[href="#section-chat"]')
    assert page.url.endswith("/admin/config/#section-chat")
    context.close()
