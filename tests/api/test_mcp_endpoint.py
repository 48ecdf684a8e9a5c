"""The MCP endpoint's tool calls in-process: one transaction, our codes, every call recorded, the token's
rate limit (live over HTTP: test_mcp_endpoint_live.py)."""

from __future__ import annotations

import pytest

from api.access import api_token_create
from api.mcp.endpoint_tools import tool_call
from api.models import McpEndpointCall
from scheduling.life.models import MemorySlot
from scheduling.models import ScheduledMessage


@pytest.mark.django_db
def test_endpoint_refusals_write_nothing_and_every_call_is_recorded(make_session):
    token, _ = api_token_create(name="fast", scopes=["send", "read_own", "cancel"])
    session = make_session()
    ok, refused = tool_call(token_id=token.pk, name="remember", arguments={"key": "k", "content": "c"})
    assert (ok, refused["code"]) == (False, "insufficient_scope")
    ok, refused = tool_call(
        token_id=token.pk, name="send_message", arguments={"conversation_id": session.session_id, "text": "x" * 5000}
    )
    assert (ok, refused["code"], refused["field"]) == (False, "text_too_long", "text")
    ok, refused = tool_call(token_id=token.pk, name="send_message", arguments={"conversation_id": 5, "text": ["x"]})
    assert (ok, refused["code"], refused["field"]) == (False, "validation_error", "text")
    assert [e["field"] for e in refused["errors"]] == ["text"]
    assert ScheduledMessage.objects.count() == 0 and MemorySlot.objects.count() == 0
    calls = list(McpEndpointCall.objects.order_by("id").values_list("tool", "ok", "error_code"))
    assert calls == [
        ("remember", False, "insufficient_scope"),
        ("send_message", False, "text_too_long"),
        ("send_message", False, "validation_error"),
    ]


@pytest.mark.django_db
def test_tool_calls_count_against_the_tokens_rate_limit(make_session):
    from core import config

    token, _ = api_token_create(name="busy")
    with config.override(api={"rate_limit_per_minute": 2}):
        outcomes = [tool_call(token_id=token.pk, name="list_conversations", arguments={}) for _ in range(3)]
    assert [ok for ok, _ in outcomes] == [True, True, False]
    assert outcomes[2][1]["code"] == "rate_limited" and "retry in" in outcomes[2][1]["message"]
