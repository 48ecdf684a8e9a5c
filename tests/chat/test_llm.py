"""The LLM client through the real openai SDK against the local scripted server; every call ledgered."""

import json

import pytest

from chat.agent import llm
from chat.models import LLMCall
from core import config
from tests.fake_llm import FakeLLM
from tests.internal_service import SECRET, BannerService, InternalService

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


def test_the_sync_call_sends_the_same_request_and_records_the_same_ledger_row(fake_llm):
    fake_llm.script(fake_llm.tool_calls(("reply", {"text": "你好"})), fake_llm.error(500))
    tools = [{"type": "function", "function": {"name": "reply", "parameters": {"type": "object"}}}]
    result = llm.complete_sync(purpose="summary", messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert result.ok and result.tool_calls[0].arguments == {"text": "你好"}
    assert fake_llm.requests[0]["tools"] == tools and fake_llm.requests[0]["model"] == "fake-model"
    call = LLMCall.objects.get(pk=result.call_id)
    assert (call.purpose, call.model, call.prompt_tokens, call.completion_tokens) == ("summary", "fake-model", 100, 20)
    assert float(call.cost) == pytest.approx(100 * 2 / 1e6 + 20 * 8 / 1e6)
    failed = llm.complete_sync(purpose="summary", messages=[{"role": "user", "content": "x"}])
    assert "HTTP 500" in failed.error and "HTTP 500" in LLMCall.objects.get(pk=failed.call_id).error


def test_a_hard_timeout_bounds_the_whole_sync_call_and_is_ledgered(fake_llm):
    fake_llm.script(*[fake_llm.delay(2, fake_llm.text("late"))] * 3)
    with config.override(llm={"max_retries": 2}):
        slow = llm.complete_sync(
            purpose="life", messages=[{"role": "user", "content": "x"}], timeout=0.3, hard_timeout=True
        )
    assert slow.timed_out and slow.error == "timeout after 0.3s" and slow.latency_ms < 2000
    assert len(fake_llm.requests) == 1  # no retry restarted the clock
    assert LLMCall.objects.get(pk=slow.call_id).error == "timeout after 0.3s"


# --- what a failure keeps of the remote answer ------------------------------------------------------------
# The ledger, the planner's cycles and the live log are read by staff who are not superusers, some of whom
# may point a model at any URL: they keep the kind of failure and at most the provider's short message.

LONG_MESSAGE = "Incorrect API key provided: sk-****. " + "x" * 300 + SECRET


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        (
            lambda: InternalService(401, "application/json", json.dumps({"error": {"message": LONG_MESSAGE}})),
            LONG_MESSAGE,
        ),
        (lambda: InternalService(502, "text/html", f"<html>{SECRET}</html>"), "HTTP 502"),
        (lambda: InternalService(200, "application/json", json.dumps({"choices": {"0": SECRET}})), ""),
        (BannerService, "connection failed: RemoteProtocolError"),
    ],
    ids=["long-provider-message", "html-body", "not-an-answer", "not-http"],
)
def test_a_failure_keeps_its_kind_and_at_most_a_short_provider_message(service, expected, caplog):
    internal = service()
    try:
        with config.override(llm={"base_url": internal.url, "model": "m", "max_retries": 0}):
            result = llm.complete_sync(purpose="summary", messages=[{"role": "user", "content": "x"}])
    finally:
        internal.close()
    call = LLMCall.objects.get(pk=result.call_id)
    logged = [r.getMessage() for r in caplog.records if r.name == "chat.agent.llm"]
    assert call.error == result.error and len(logged) == 1 and logged[0].endswith(result.error)
    assert SECRET not in result.error
    if expected == LONG_MESSAGE:  # the provider's own message, on one line and shortened
        assert result.error.startswith("HTTP 401: Incorrect API key provided: sk-****. xxx")
        assert len(result.error) == len("HTTP 401: ") + llm.PROVIDER_MESSAGE_MAX and result.error.endswith("…")
    elif expected:
        assert result.error == expected
    else:
        assert result.error == result.failure == "not a chat-completions answer"


def test_a_refused_connection_says_why():
    import socket

    with socket.socket() as unused:  # a port nobody listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with config.override(llm={"base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "max_retries": 0}):
        result = llm.complete_sync(purpose="summary", messages=[{"role": "user", "content": "x"}])
    assert result.failure == "connection failed" and result.error == "connection failed: [Errno 111] Connection refused"
