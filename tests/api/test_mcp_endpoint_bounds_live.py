"""What a bounded or busy token gets from the bot's MCP endpoint on a live daphne, through the real MCP
client: a token bound to channels reads only those channels' messages (read_all included) and never
the bot's global inner state; listing tools and resources and reading a resource count against the
token's rate limit as tool calls do."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from mcp.shared.exceptions import MCPError

from api.access import api_token_create
from api.models import ApiRateWindow
from chat.models import ApiScope, ApiToken
from scheduling.life.memory import inner_state_update
from scheduling.life.models import InnerState
from scheduling.models import ScheduledMessage
from tests.api.mcp_client import call, mcp_session
from tests.conftest import db

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

ALL_SCOPES = list(ApiScope.values)
INNER_STATE_TOOLS = {"get_inner_state", "update_inner_state"}


async def token(name: str, **kw) -> str:
    return (await db(api_token_create, name=name, **kw))[1]


async def test_a_token_bound_to_a_channel_reads_only_it_and_never_the_inner_state(shared_server, make_session):
    _, base = shared_server
    await db(inner_state_update, text="the bot's own mood", via="operator")
    writer = await token("mcp-writer", scopes=ALL_SCOPES)
    qq_chat = await db(make_session, platform="qq")
    discord_chat = await db(make_session, platform="discord")
    later = (timezone.now() + timedelta(days=30)).isoformat()
    sent = {}
    async with mcp_session(base, writer) as mcp:
        for name, chat in (("qq", qq_chat), ("discord", discord_chat)):
            ok, message = await call(mcp, "send_message", conversation_id=chat.session_id, text=name, send_at=later)
            assert ok, message
            sent[name] = message["id"]

    bound = await token("mcp-qq-only", scopes=ALL_SCOPES, allowed_channels=["qq"])
    async with mcp_session(base, bound) as mcp:
        offered = {t.name for t in (await mcp.list_tools()).tools}
        assert "list_messages" in offered and not offered & INNER_STATE_TOOLS
        ok, page = await call(mcp, "list_messages")
        assert ok and [m["id"] for m in page["items"]] == [sent["qq"]], page
        ok, refused = await call(mcp, "get_message", message_id=sent["discord"])
        assert (ok, refused["code"]) == (False, "message_not_found")
        ok, refused = await call(mcp, "cancel_message", message_id=sent["discord"])
        assert (ok, refused["code"]) == (False, "message_not_found")
        # Not offered, and refused when called all the same: neither read nor written.
        ok, refused = await call(mcp, "get_inner_state")
        assert (ok, refused["code"]) == (False, "forbidden_conversation"), refused
        assert "the bot's own mood" not in str(refused)
        ok, refused = await call(mcp, "update_inner_state", text="hijacked")
        assert (ok, refused["code"]) == (False, "forbidden_conversation"), refused
        uris = [str(r.uri) for r in (await mcp.list_resources()).resources]
        assert f"maibot://conversations/{qq_chat.session_id}/messages" in uris
        assert f"maibot://conversations/{discord_chat.session_id}/messages" not in uris
        with pytest.raises(MCPError, match="forbidden_conversation"):
            await mcp.read_resource(f"maibot://conversations/{discord_chat.session_id}/messages")
    assert await db(lambda: InnerState.objects.get(pk=1).text) == "the bot's own mood"
    assert await db(lambda: ScheduledMessage.objects.get(pk=sent["discord"]).status) == "pending"


async def test_listing_and_reading_count_against_the_tokens_rate_limit(shared_server, make_session):
    _, base = shared_server
    raw = await token("mcp-busy", scopes=ALL_SCOPES)
    chat = await db(make_session, platform="qq")
    async with mcp_session(base, raw) as mcp:
        assert (await mcp.list_tools()).tools  # within the limit: served

        # This minute's budget (and the next one's, should the minute turn meanwhile) is spent, whatever
        # the limit.
        def spend() -> None:
            api_token = ApiToken.objects.get(name="mcp-busy")
            minute = timezone.now().replace(second=0, microsecond=0)
            for start in (minute, minute + timedelta(minutes=1)):
                ApiRateWindow.objects.update_or_create(
                    token=api_token, window_start=start, defaults={"count": 1_000_000}
                )

        await db(spend)
        for request in (
            mcp.list_tools(),
            mcp.list_resources(),
            mcp.list_resource_templates(),
            mcp.read_resource("maibot://conversations"),
            mcp.read_resource(f"maibot://conversations/{chat.session_id}/messages"),
        ):
            with pytest.raises(MCPError) as refused:
                await request
            assert refused.value.data["code"] == "rate_limited", refused.value
            assert refused.value.message.startswith("rate_limited: too many requests for this token; retry in ")
        ok, body = await call(mcp, "list_conversations")
        assert (ok, body["code"]) == (False, "rate_limited")
