"""The "Connect an adapter" page in headless Chromium against a real daphne, in Simplified Chinese and in
English: the token is not in the page until "show" is clicked, a rotation shows the new token in the
snippet, and an adapter that connects appears in the table without a reload (the page polls)."""

from __future__ import annotations

import pytest

from chat.models import AdapterConnection
from core import deployment_env
from tests.conftest import CHROMIUM_ARGS, require_chromium
from tests.console.conftest import in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

TOKEN = "browser-qq-token-123456"


@pytest.mark.parametrize(
    ("locale", "title", "connected"),
    [("zh-CN", "连接适配器", "已连接"), ("en-US", "Connect an adapter", "connected")],
)
def test_the_connect_page_reveals_rotates_and_follows_the_adapter(
    browser_operator, start_server, tmp_path, locale, title, connected
):
    require_chromium()
    from playwright.sync_api import sync_playwright

    data = tmp_path / "data-web"
    data.mkdir(mode=0o700)
    deployment_env.update(data / deployment_env.FILE_NAME, {"MAIBOT_ADAPTER_TOKENS": f"qq:{TOKEN}"})
    _, base = start_server()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(locale=locale, viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(20_000)
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"{base}/admin/login/?next=/admin/connect/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "pw-123456")
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/connect/")
        assert title in page.title()
        assert TOKEN not in page.content()
        snippet = page.locator("#snippet-apiserver")
        assert "enable_api_server = true" in snippet.inner_text() and base.replace("http", "ws") in page.content()
        page.locator('tr.secret[data-secret="adapter:qq"] button.secret-reveal').click()
        page.wait_for_function(f"document.querySelector('#snippet-apiserver').innerText.includes('{TOKEN}')")
        assert page.locator("#secret-result").inner_text() == ""  # a reveal says nothing else

        page.locator('tr.secret[data-secret="adapter:qq"] button.secret-rotate').click()
        page.wait_for_function(
            f"!document.querySelector('#snippet-apiserver').innerText.includes('{TOKEN}') && "
            "document.querySelector('#secret-result').className === 'console-ok'"
        )
        new_token = snippet.inner_text().split('api_key = "')[1].split('"')[0]
        assert len(new_token) >= 32
        assert deployment_env.read(data / deployment_env.FILE_NAME)["MAIBOT_ADAPTER_TOKENS"] == f"qq:{new_token}"

        in_thread(lambda: AdapterConnection.objects.create(platform="qq", protocol="socketio", remote="127.0.0.1"))
        page.wait_for_function(
            f"document.querySelector('#adapter-state tr[data-platform=qq]')?.innerText.includes('{connected}')"
        )
        page.screenshot(path=f"/tmp/maibot-console-connect-{locale}.png", full_page=True)
        browser.close()
