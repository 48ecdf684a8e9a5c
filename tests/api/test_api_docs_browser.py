"""The interactive API docs in headless Chromium against a live daphne server, with every request
off this machine blocked: Swagger UI loads from our own static files and can call the API."""

from __future__ import annotations

import pytest

from api.access import api_token_create
from tests.conftest import CHROMIUM_ARGS, require_chromium

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]


def test_swagger_ui_works_offline_and_calls_the_api(shared_server, make_session):
    require_chromium()
    from playwright.sync_api import sync_playwright

    _, base = shared_server
    # ORM work before playwright: its event loop in this thread makes Django refuse sync ORM calls.
    _, raw = api_token_create(name="docs")
    session = make_session(chat_type="private", platform="qq", user_id="10001")
    outside: list[str] = []

    def route(route) -> None:
        if route.request.url.startswith(base):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.route("**/*", route)
            page.goto(f"{base}/api/v1/docs")
            page.wait_for_selector(".opblock")
            summaries = page.locator(".opblock-summary-path").all_inner_texts()
            assert {s.replace("\u200b", "") for s in summaries} == {
                "/api/v1/messages",
                "/api/v1/messages/{message_id}",
                "/api/v1/messages/{message_id}/cancel",
                "/api/v1/conversations",
            }
            # Authorize with a bearer token and try GET /conversations from the page.
            page.click("button.authorize")
            page.fill(".modal-ux input[type=text], .modal-ux input[type=password]", raw)
            page.click(".modal-ux button.authorize")
            page.click(".modal-ux button.close-modal")
            block = page.locator(".opblock-get", has_text="/api/v1/conversations")
            block.locator(".opblock-summary").click()
            block.locator("button.try-out__btn").click()
            block.locator("button.execute").click()
            block.locator(".live-responses-table tr.response .response-col_status").first.wait_for()
            assert (
                block.locator(".live-responses-table tr.response .response-col_status").first.inner_text().strip()
                == "200"
            )
            assert session.session_id in block.locator(".live-responses-table .microlight").first.inner_text()
        finally:
            browser.close()
    assert outside == []
