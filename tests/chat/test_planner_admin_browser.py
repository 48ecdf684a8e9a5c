"""The planner's record in the operator console, in headless Chromium against a live daphne:
usage chart drawn server-side (no script, nothing fetched from elsewhere), cycle page readable."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.models import LLMCall, PlannerCycle, ToolCallRecord
from tests.conftest import CHROMIUM_ARGS, require_chromium

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]


@pytest.fixture
def recorded(transactional_db, make_session):
    get_user_model().objects.create_superuser("operator", password="s3cret-pass")
    session = make_session(user_nickname="Alice")
    cycle = PlannerCycle.objects.create(
        session=session,
        started_at=timezone.now(),
        ended_at=timezone.now(),
        action="reply",
        prompt=[{"role": "system", "content": "你是麦麦"}, {"role": "user", "content": "Alice: 早上好"}],
    )
    ToolCallRecord.objects.create(cycle=cycle, tool_call_id="call_1", name="reply", arguments={"text": "早！"})
    LLMCall.objects.create(
        cycle=cycle, session=session, purpose="planner", model="fake-model", prompt_tokens=900,
        completion_tokens=40, cost=Decimal("0.0021"),
    )  # fmt: skip
    return cycle


async def test_usage_chart_and_cycle_page_in_a_browser(shared_server, recorded):
    from playwright.async_api import async_playwright, expect

    _, base = shared_server
    foreign = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            page.on("request", lambda r: None if r.url.startswith((base, "data:")) else foreign.append(r.url))
            await page.goto(f"{base}/admin/login/?next=/admin/chat/llmcall/usage/")
            await expect(page.locator("#offline-banner")).to_contain_text("Offline mode: no model configured")
            await page.fill("#id_username", "operator")
            await page.fill("#id_password", "s3cret-pass")
            await page.click("input[type=submit]")
            await page.wait_for_url(f"{base}/admin/chat/llmcall/usage/")
            chart = page.locator(".usage-chart svg")
            await expect(chart).to_be_visible()
            box = await chart.bounding_box()
            assert box["width"] > 500 and box["height"] > 150
            today_bar = page.locator(".usage-chart g.bar").last
            await expect(today_bar.locator("title")).to_contain_text("900 prompt, 40 completion tokens")
            bar_box = await today_bar.locator("rect").first.bounding_box()
            assert bar_box["height"] > 100  # the only day with calls is the tallest bar
            await expect(page.locator("#usage-per-model")).to_contain_text("fake-model")

            await page.goto(f"{base}/admin/chat/plannercycle/{recorded.pk}/change/")
            await expect(page.locator(".prompt-message").nth(1)).to_contain_text("Alice: 早上好")
            await expect(page.locator("body")).to_contain_text("call_1")
            await expect(page.locator("body")).to_contain_text("900 prompt + 40 completion tokens")
        finally:
            await browser.close()
    assert foreign == []
