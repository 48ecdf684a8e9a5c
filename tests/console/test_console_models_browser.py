"""The model test button in headless Chromium against a real daphne server whose models are the
scripted server: clicking it shows how each model's call went, its latency and tool calling, and
nothing the model or the provider sent back."""

from __future__ import annotations

import pytest

from tests.conftest import CHROMIUM_ARGS, require_chromium
from tests.console.test_console_models import answer_by_model
from tests.fake_llm import FakeLLM

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]


def test_the_model_test_button_shows_each_models_outcome(browser_operator, start_server, tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    with FakeLLM() as provider:
        provider.default = answer_by_model(provider)
        data = tmp_path / "data-web"
        data.mkdir()
        models = "".join(
            f'[[llm.models]]\nname = "{name}"\nbase_url = "{provider.base_url}"\nmodel = "{name}-1"\n\n'
            for name in ("good", "chatty", "broken")
        )
        (data / "bot_config.toml").write_text(f'[bot]\nlanguage = "en"\n\n{models}', encoding="utf-8")
        _, base = start_server()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.goto(f"{base}/admin/login/?next=/admin/models/")
            page.fill("#id_username", "op")
            page.fill("#id_password", "pw-123456")
            page.click("input[type=submit]")
            page.wait_for_url(f"{base}/admin/models/")
            assert page.inner_text("#model-routes").count("good") == 4  # every task to the first model
            page.click("#test-all input[type=submit]")
            page.wait_for_selector("#model-test-results")
            cells = {
                row.get_attribute("data-model"): {
                    c: row.query_selector(f".{c}").inner_text() for c in ("outcome", "tool-calling", "latency")
                }
                for row in page.query_selector_all("tr.model-test")
            }
            shown = page.inner_text("#model-test-results")
            page.screenshot(path="/tmp/maibot-console-models.png", full_page=True)
            # One model alone, with its own button.
            page.click("#test-good")
            page.wait_for_selector("#model-test-results")
            alone = [r.get_attribute("data-model") for r in page.query_selector_all("tr.model-test")]
            browser.close()
    assert cells["good"] == cells["good"] | {"outcome": "answered", "tool-calling": "works"}
    assert cells["chatty"] == cells["chatty"] | {"outcome": "answered", "tool-calling": "no tool call"}
    assert cells["broken"] == cells["broken"] | {"outcome": "failed: HTTP 500", "tool-calling": "—"}
    assert "pong!" not in shown and "echo" not in shown and "the provider is down" not in shown
    assert all(c["latency"].endswith(" ms") for c in cells.values())
    assert alone == ["good"]
    assert sorted(r["model"] for r in provider.requests) == ["broken-1", "chatty-1", "good-1", "good-1"]
