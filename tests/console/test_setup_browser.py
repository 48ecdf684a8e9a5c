"""The first-run set-up page in headless Chromium against a real daphne with a pending set-up, in the
browser's language (Simplified Chinese, English): the model Test warns when the model answered without
calling the tool (and says OK when it did), and finishing the set-up lands the new operator on the
dashboard, in the same language."""

from __future__ import annotations

import shutil

import pytest

from core import setup
from tests.core.test_setup_page import FORM
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

CODE = "the-printed-code"


@pytest.fixture
def pending_server(start_server, tmp_path):
    data = tmp_path / "data-setup"
    data.mkdir(parents=True)
    (data / setup.CODE_FILE).write_text(CODE + "\n")
    _, base = start_server("setup")
    return base


# What the page says in each browser language.
TEXTS = {
    "en-US": {
        "title": "Set up maibot",
        "warning": "Warning: the model answered in ",
        "no_tool": "did not call the offered tool",
        "ok": "OK in ",
        "health": "Health",
    },
    "zh-CN": {
        "title": "设置麦麦",
        "warning": "警告：模型在 ",
        "no_tool": "没有调用提供的工具",
        "ok": "正常，用时 ",
        "health": "健康状态",
    },
}


@pytest.mark.parametrize("language", TEXTS)
def test_the_model_test_warns_without_a_tool_call_and_the_set_up_lands_on_the_dashboard(
    pending_server, browser, tmp_path, language
):
    base, texts = pending_server, TEXTS[language]
    with FakeLLM() as provider:
        provider.script(provider.text("I'd rather chat."), provider.tool_call("echo", {"word": "ping"}))
        context = browser.new_context(viewport={"width": 1100, "height": 1400}, locale=language)
        page = context.new_page()
        page.set_default_timeout(20_000)
        page.goto(f"{base}/setup/")
        assert page.inner_text("h1") == texts["title"]
        page.fill("#id_code", CODE)
        page.fill("#id_llm_base_url", provider.base_url)
        page.fill("#id_llm_model", "fake-1")
        result = page.locator("#model-test-result")

        page.click("#model-test")
        page.wait_for_selector("#model-test-result.warning")
        assert result.inner_text().startswith(texts["warning"])
        assert texts["no_tool"] in result.inner_text()

        page.click("#model-test")
        page.wait_for_selector("#model-test-result.success")
        assert result.inner_text().startswith(texts["ok"])

    for name in ("username", "password", "password2", "nickname", "persona"):
        page.fill(f"#id_{name}", FORM[name])
    page.fill("#id_llm_model", "")  # finish in offline mode: the fake model is gone
    assert page.is_checked("#id_adapter_mode_0")  # on this machine, without a token
    shot = tmp_path / f"setup-{language}.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copy(shot, f"/tmp/maibot-setup-{language}.png")
    page.click("#setup-submit")
    page.wait_for_url(f"{base}/admin/console/")
    assert page.inner_text("#health h2") == texts["health"]
    context.close()
