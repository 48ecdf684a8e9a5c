"""The bot's MCP endpoint (/mcp) on a live daphne (and the shared qcluster), through the real MCP client:
every tool, bad tokens and scopes, the routing errors, a scheduled message delivered to the real
maim_message client."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx2
import pytest
from django.utils import timezone
from mcp.shared.exceptions import MCPError

from api.access import api_token_create, api_token_revoke
from chat.models import ApiScope, ApiToken, ChatSession, Message
from scheduling.life.models import InnerState, InnerStateRevision, MemorySlot, Timer
from scheduling.models import ScheduledMessage
from tests.api.mcp_client import call, mcp_session
from tests.chat.gateway_helpers import Adapter06, never_echoes
from tests.conftest import db, shared_adapter_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

ALL_SCOPES = list(ApiScope.values)
# A platform of these tests' own: the shared server's outbox for it holds only what they send.
PLATFORM = "mcptest"


def only_mcp_error(exc: BaseException) -> MCPError:
    """The one MCPError an exception (group) carries."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    assert isinstance(exc, MCPError), repr(exc)
    return exc


async def token(name: str, **kw) -> str:
    return (await db(api_token_create, name=name, **kw))[1]


async def test_messages_now_and_scheduled_reach_the_real_adapter(shared_server, shared_qcluster, make_session):
    _, base = shared_server
    raw = await token("mcp-messages", scopes=ALL_SCOPES)
    group = await db(make_session, chat_type="group", platform=PLATFORM)
    await db(never_echoes, PLATFORM)  # known not to echo: "later" goes at once (chat.delivery_gate)
    adapter = await Adapter06(base, platform=PLATFORM, token=shared_adapter_token(PLATFORM)).start()
    try:
        async with mcp_session(base, raw) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert names == {
                "send_message",
                "get_message",
                "list_messages",
                "cancel_message",
                "list_conversations",
                "get_inner_state",
                "update_inner_state",
                "list_memory",
                "remember",
                "forget",
                "list_timers",
                "set_timer",
                "cancel_timer",
            }

            ok, now = await call(mcp, "send_message", conversation_id=group.session_id, text="现在 now via MCP")
            assert ok, now
            assert now["origin"] == "mcp" and now["delivery"] is not None
            frame = await adapter.next_message()
            assert frame["message_segment"]["data"][0]["data"] == "现在 now via MCP"
            assert frame["message_info"]["message_id"] == now["delivery"]["message_id"]

            send_at = (timezone.now() + timedelta(seconds=2)).isoformat()
            ok, later = await call(
                mcp, "send_message", conversation_id=group.session_id, text="稍后 later", send_at=send_at
            )
            assert ok and later["status"] == "pending", later
            frame = await adapter.next_message(timeout=30)
            assert frame["message_segment"]["data"][0]["data"] == "稍后 later"
            ok, detail = await call(mcp, "get_message", message_id=later["id"])
            assert ok and detail["delivery"]["message_id"] == frame["message_info"]["message_id"], detail

            far = (timezone.now() + timedelta(days=1)).isoformat()
            ok, pending = await call(mcp, "send_message", conversation_id=group.session_id, text="明天", send_at=far)
            assert ok, pending
            ok, cancelled = await call(mcp, "cancel_message", message_id=pending["id"], reason="changed plans")
            assert ok and cancelled["status"] == "cancelled" and cancelled["cancel_reason"] == "changed plans"
            ok, again = await call(mcp, "cancel_message", message_id=pending["id"])
            assert (ok, again["code"]) == (False, "not_pending")

            ok, page = await call(mcp, "list_messages", conversation_id=group.session_id, limit=2)
            assert ok and page["count"] == 3 and len(page["items"]) == 2 and page["next_offset"] == 2
            assert [m["id"] for m in page["items"]] == [pending["id"], later["id"]]
            ok, page = await call(mcp, "list_conversations", channel_type=PLATFORM)
            assert ok and [c["conversation_id"] for c in page["items"]] == [group.session_id]

            # The same idempotency key and arguments: the first answer again, nothing sent twice.
            args = {"conversation_id": group.session_id, "text": "once", "send_at": far, "idempotency_key": "k-1"}
            first, second = await call(mcp, "send_message", **args), await call(mcp, "send_message", **args)
            assert first == second and first[0]
            ok, reused = await call(mcp, "send_message", **{**args, "text": "other"})
            assert (ok, reused["code"]) == (False, "idempotency_key_reused")
    finally:
        await adapter.stop()
    origins = await db(lambda: set(ScheduledMessage.objects.values_list("origin", flat=True)))
    assert origins == {"mcp"}
    assert await db(lambda: ScheduledMessage.objects.filter(message_text="once").count()) == 1
    texts = await db(lambda: list(Message.objects.filter(session=group).order_by("pk").values_list("text", flat=True)))
    assert texts == ["现在 now via MCP", "稍后 later"]


async def test_inner_state_memory_and_timers(shared_server, make_session):
    _, base = shared_server
    raw = await token("mcp-life", scopes=ALL_SCOPES)
    chat = await db(make_session, platform=PLATFORM)
    async with mcp_session(base, raw) as mcp:
        ok, state = await call(mcp, "update_inner_state", text="想念大家 missing everyone")
        assert ok and state["updated_by"] == "mcp", state
        ok, state = await call(mcp, "get_inner_state")
        assert ok and state["text"] == "想念大家 missing everyone"

        assert (await call(mcp, "remember", key="birthday", content="3月1日", conversation_id=chat.session_id))[0]
        assert (await call(mcp, "remember", key="motto", content="be kind"))[0]
        ok, memory = await call(mcp, "list_memory", conversation_id=chat.session_id)
        assert ok and [s["key"] for s in memory["global"]] == ["motto"]
        assert [(s["key"], s["content"]) for s in memory["conversation"]] == [("birthday", "3月1日")]
        ok, gone = await call(mcp, "forget", key="motto")
        assert ok and gone["forgotten"]
        ok, missing = await call(mcp, "forget", key="motto")
        assert (ok, missing["code"]) == (False, "not_found")
        ok, bad = await call(mcp, "remember", key="two\nlines", content="x")
        assert (ok, bad["code"]) == (False, "invalid_key")

        ok, timer = await call(mcp, "set_timer", spec="2h", label="喝水 drink water", conversation_id=chat.session_id)
        assert ok and timer["status"] == "active", timer
        ok, listed = await call(mcp, "list_timers", conversation_id=chat.session_id)
        assert ok and [t["timer_id"] for t in listed["timers"]] == [timer["timer_id"]]
        ok, own = await call(mcp, "list_timers")
        assert ok and own["timers"] == []
        ok, bad = await call(mcp, "set_timer", spec="yesterday-ish", label="x")
        assert (ok, bad["code"]) == (False, "invalid_spec")
        ok, cancelled = await call(mcp, "cancel_timer", timer_id=timer["timer_id"], conversation_id=chat.session_id)
        assert ok and cancelled["status"] == "cancelled"

        listed = await mcp.list_resources()
        uris = [str(r.uri) for r in listed.resources]
        assert "maibot://conversations" in uris
        history_uri = f"maibot://conversations/{chat.session_id}/messages"
        assert history_uri in uris
        read = await mcp.read_resource(history_uri)
        body = json.loads(read.contents[0].text)
        assert body["conversation"]["conversation_id"] == chat.session_id and body["messages"] == []
        with pytest.raises(MCPError, match="conversation_not_found"):
            await mcp.read_resource("maibot://conversations/nope/messages")

    assert await db(lambda: InnerState.objects.get(pk=1).text) == "想念大家 missing everyone"
    assert await db(lambda: InnerStateRevision.objects.filter(via="mcp").count()) == 1
    assert await db(lambda: list(MemorySlot.objects.values_list("key", "updated_via"))) == [("birthday", "mcp")]
    assert await db(lambda: Timer.objects.get().created_via) == "api"


async def test_bad_tokens_are_refused_with_our_code(shared_server):
    _, base = shared_server
    raw = await token("mcp-revoked")
    async with httpx2.AsyncClient(timeout=30) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        answers = []
        for auth in (None, "Bearer mbt_not-a-token", f"Basic {raw}"):
            response = await http.post(
                f"{base}/mcp", json=initialize, headers={**headers, **({"Authorization": auth} if auth else {})}
            )
            error = response.json()["error"]
            assert error["message"] == f"{error['data']['code']}: {error['data']['message']}"
            answers.append((response.status_code, error["data"]["code"], response.headers["www-authenticate"]))
        assert answers == [
            (401, "not_authenticated", 'Bearer realm="maibot"'),
            (401, "invalid_token", 'Bearer realm="maibot"'),
            (401, "not_authenticated", 'Bearer realm="maibot"'),
        ]
    # The real client cannot open a session with a bad token, nor with a revoked one.
    # The SDK's transport raises it from its task group, wrapped in exception groups.
    with pytest.raises(BaseException) as refused:
        async with mcp_session(base, "mbt_not-a-token"):
            pass
    error = only_mcp_error(refused.value)
    assert (error.code, error.message, error.data["code"]) == (
        -32001,
        "invalid_token: the bearer token is not valid",
        "invalid_token",
    )

    async with mcp_session(base, raw) as mcp:
        assert (await call(mcp, "list_conversations"))[0]
        await db(lambda: api_token_revoke(token=ApiToken.objects.get(name="mcp-revoked")))
        with pytest.raises(MCPError) as refused:
            await mcp.call_tool("list_conversations", {})
        assert (refused.value.message, refused.value.data["code"]) == (
            "token_revoked: this token has been revoked",
            "token_revoked",
        )


async def test_scopes_and_reach_decide_what_a_token_may_do(shared_server, make_session):
    _, base = shared_server
    default = await token("mcp-default")
    web = await db(make_session, platform="web")
    async with mcp_session(base, default) as mcp:
        names = {t.name for t in (await mcp.list_tools()).tools}
        assert names == {"send_message", "get_message", "list_messages", "cancel_message", "list_conversations"}
        for name, args in [
            ("remember", {"key": "k", "content": "c"}),
            ("get_inner_state", {}),
            ("set_timer", {"spec": "5min", "label": "x"}),
        ]:
            ok, refused = await call(mcp, name, **args)
            assert (ok, refused["code"]) == (False, "insufficient_scope"), (name, refused)
        # The operators' browser chat is reachable only by a token naming the channel.
        ok, refused = await call(mcp, "send_message", conversation_id=web.session_id, text="hi")
        assert (ok, refused["code"]) == (False, "forbidden_conversation")
        with pytest.raises(MCPError, match="insufficient_scope"):
            await mcp.read_resource(f"maibot://conversations/{web.session_id}/messages")

    limited = await token("mcp-limited", scopes=ALL_SCOPES, allowed_channels=[PLATFORM])
    async with mcp_session(base, limited) as mcp:
        ok, refused = await call(mcp, "remember", key="k", content="global fact")
        assert (ok, refused["code"], refused["field"]) == (False, "forbidden_conversation", "conversation_id")
        ok, refused = await call(mcp, "list_timers", conversation_id=web.session_id)
        assert (ok, refused["code"]) == (False, "forbidden_conversation")
    assert await db(lambda: MemorySlot.objects.count()) == 0


async def test_routing_and_input_errors_write_nothing(shared_server, make_session):
    _, base = shared_server
    raw = await token("mcp-errors", scopes=ALL_SCOPES)
    group = await db(make_session, chat_type="group", platform=PLATFORM)
    sessions_before = await db(ChatSession.objects.count)
    async with mcp_session(base, raw) as mcp:
        cases = [
            ({"text": "hi"}, "missing_anchor", None),
            ({"conversation_id": group.session_id, "channel_user_id": "1", "text": "hi"}, "conflicting_anchor", None),
            ({"channel_thread_id": "42", "text": "hi"}, "missing_channel_type", "channel_type"),
            ({"channel_type": PLATFORM, "channel_thread_id": "999999", "text": "hi"}, "thread_not_found", None),
            # A new private chat would be created for it: the refusal undoes that too.
            ({"channel_type": PLATFORM, "channel_user_id": "new-person", "text": " \u200b "}, "empty_text", "text"),
            ({"conversation_id": group.session_id, "text": "hi", "send_at": "2020-01-01T00:00:00+00:00"}, None, None),
            ({"conversation_id": group.session_id, "text": "hi", "send_at": "tomorrow"}, "validation_error", None),
            ({"conversation_id": group.session_id, "txt": "typo"}, "validation_error", "txt"),
            ({"conversation_id": group.session_id, "text": "a\x00b"}, "validation_error", "text"),
        ]
        for args, code, field in cases:
            ok, error = await call(mcp, "send_message", **args)
            assert not ok, (args, error)
            assert error["code"] == (code or "invalid_send_at"), (args, error)
            assert error["message"], error
            if field:
                assert error["field"] == field, (args, error)
        ok, error = await call(mcp, "no_such_tool")
        assert (ok, error["code"]) == (False, "unknown_tool")
    assert await db(ScheduledMessage.objects.count) == 0
    assert await db(ChatSession.objects.count) == sessions_before
