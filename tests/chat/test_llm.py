"""The LLM client through the real openai SDK against the local scripted server; every call ledgered."""

import pytest

from chat.agent import llm
from chat.models import LLMCall
from maibot import config
from tests.fake_llm import FakeLLM

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake_llm():
    with (
        FakeLLM() as server,
        config.override(
            llm={
                "base_url": server.base_url,
                "model": "fake-model",
                "max_retries": 0,
                "price_input_per_1m": 2.0,
                "price_output_per_1m": 8.0,
            }
        ),
    ):
        yield server


async def test_text_answer_is_returned_and_ledgered_with_cost(fake_llm):
    fake_llm.script(fake_llm.text("pong", usage=(1000, 500, 200)))
    result = await llm.complete(purpose="planner", messages=[{"role": "user", "content": "ping"}])
    assert result.ok and result.content == "pong"
    call = await LLMCall.objects.aget(pk=result.call_id)
    assert (call.prompt_tokens, call.completion_tokens, call.cached_tokens) == (1000, 500, 200)
    assert float(call.cost) == pytest.approx(1000 * 2 / 1e6 + 500 * 8 / 1e6)
    assert fake_llm.requests[0]["messages"][0]["content"] == "ping"


async def test_tool_calls_are_parsed_and_malformed_arguments_flagged(fake_llm):
    fake_llm.script(fake_llm.tool_calls(("reply", {"text": "你好"}), ("reply", "{not json")))
    result = await llm.complete(purpose="planner", messages=[{"role": "user", "content": "hi"}], tools=[])
    good, bad = result.tool_calls
    assert good.arguments == {"text": "你好"}
    assert bad.arguments is None and bad.argument_error


async def test_http_error_and_timeout_are_recorded_not_raised(fake_llm):
    fake_llm.script(fake_llm.error(500), fake_llm.delay(2, fake_llm.text("late")))
    failed = await llm.complete(purpose="planner", messages=[{"role": "user", "content": "x"}])
    assert "HTTP 500" in failed.error
    slow = await llm.complete(purpose="planner", messages=[{"role": "user", "content": "x"}], timeout=0.5)
    assert "timeout" in slow.error
    errors = [c.error async for c in LLMCall.objects.order_by("id")]
    assert "HTTP 500" in errors[0] and "timeout" in errors[1]
