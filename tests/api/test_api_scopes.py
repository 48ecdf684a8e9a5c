"""API tokens carry scopes and optionally the conversations they may reach: a default token sees and
cancels only its own messages, never the operators' browser chat; tokens from before scopes keep
everything they could do."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps as django_apps
from django.core.management import call_command
from django.utils import timezone

from api.access import api_token_create
from chat.models import ApiToken, ChatSession
from scheduling.models import ScheduledMessage
from tests.api.support import ApiClient

pytestmark = pytest.mark.django_db

LATER = (timezone.now() + timedelta(days=30)).isoformat()


def client_for(name: str, **kw) -> ApiClient:
    return ApiClient(api_token_create(name=name, **kw)[1])


def schedule(api: ApiClient, **anchor) -> str:
    anchor = anchor or {"channel_type": "qq", "channel_user_id": "10001"}
    resp = api.post("/messages", {**anchor, "text": "hi", "send_at": LATER})
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def test_a_default_token_reads_lists_and_cancels_only_its_own_messages():
    alice, bob = client_for("alice"), client_for("bob")
    mine, theirs = schedule(alice), schedule(bob)
    assert alice.get(f"/messages/{mine}").status_code == 200
    assert alice.get(f"/messages/{theirs}").json()["code"] == "message_not_found"
    assert [m["id"] for m in alice.get("/messages").json()["items"]] == [mine]
    assert alice.post(f"/messages/{theirs}/cancel").status_code == 404
    assert ScheduledMessage.objects.get(pk=theirs).status == "pending"
    assert alice.post(f"/messages/{mine}/cancel").json()["status"] == "cancelled"


def test_read_all_sees_every_message_and_a_token_without_send_cannot_send():
    schedule(client_for("writer"))
    auditor = client_for("auditor", scopes=["read_all"])
    assert auditor.get("/messages").json()["count"] == 1
    refused = auditor.post("/messages", {"channel_type": "qq", "channel_user_id": "1", "text": "x"})
    assert refused.status_code == 403 and refused.json()["code"] == "insufficient_scope"
    assert auditor.get("/conversations").json()["code"] == "insufficient_scope"
    silent = client_for("silent", scopes=["send"])
    assert silent.get("/messages").status_code == 403
    assert ScheduledMessage.objects.count() == 1


def test_no_token_reaches_the_browser_chat_unless_it_names_that_channel(make_session):
    browser = make_session(platform="web", user_id="op-1")
    api = client_for("partner")
    refused = api.post("/messages", {"conversation_id": browser.session_id, "text": "phish"})
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden_conversation"
    assert browser.session_id not in [c["conversation_id"] for c in api.get("/conversations").json()["items"]]
    allowed = client_for("console-bot", allowed_channels=["web"])
    assert allowed.post("/messages", {"conversation_id": browser.session_id, "text": "ok"}).status_code == 201


def test_allowed_conversations_bound_where_a_token_may_send_and_nothing_is_half_written(make_session):
    group = make_session(chat_type="group", group_id="555")
    api = client_for("narrow", allowed_channels=["qq"], allowed_conversations=[group.session_id])
    assert api.post("/messages", {"conversation_id": group.session_id, "text": "ok"}).status_code == 201
    sessions = ChatSession.objects.count()
    refused = api.post("/messages", {"channel_type": "qq", "channel_user_id": "new-person", "text": "x"})
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden_conversation"
    assert ChatSession.objects.count() == sessions  # no private chat was created for the refused request
    other = api.post("/messages", {"channel_type": "telegram", "channel_user_id": "1", "text": "x"})
    assert other.json()["code"] == "forbidden_conversation"


def test_tokens_made_before_scopes_keep_full_access():
    # The data step of the migration that added scopes: every token that existed then keeps all four.
    migration = importlib.import_module("chat.migrations.0004_api_token_scopes")
    legacy, _ = api_token_create(name="legacy")
    assert legacy.scopes == ["send", "read_own", "cancel"]  # what a new token gets
    migration.keep_what_existing_tokens_could_do(django_apps, None)
    assert sorted(ApiToken.objects.get(name="legacy").scopes) == ["cancel", "read_all", "read_own", "send"]


def test_operators_set_scopes_in_the_admin_and_the_command(admin_client, capsys):
    page = admin_client.post(
        "/admin/chat/apitoken/add/",
        {"name": "monitor", "scopes": ["send"], "allowed_channels": "qq, telegram", "allowed_conversations": ""},
    )
    assert page.status_code == 200 and "will not be shown again" in page.content.decode()
    token = ApiToken.objects.get(name="monitor")
    assert token.scopes == ["send"] and token.allowed_channels == ["qq", "telegram"]
    call_command("create_api_token", "cron-job", "--scope", "send", "--scope", "read_all", "--channel", "qq")
    made = ApiToken.objects.get(name="cron-job")
    assert made.scopes == ["send", "read_all"] and made.allowed_channels == ["qq"]
    assert "send, read_all" in capsys.readouterr().err


def test_read_all_on_a_token_bound_to_channels_or_conversations_reads_only_those(make_session):
    writer = client_for("writer", allowed_channels=["qq", "discord", "web"])
    qq_chat, qq_group = make_session(user_id="10001"), make_session(chat_type="group", group_id="777")
    discord_chat = make_session(platform="discord", user_id="d-1")
    browser = make_session(platform="web", user_id="op-1")
    ids = {
        name: schedule(writer, conversation_id=session.session_id)
        for name, session in (("qq", qq_chat), ("group", qq_group), ("discord", discord_chat), ("web", browser))
    }

    qq_auditor = client_for("qq-auditor", scopes=["read_all", "cancel"], allowed_channels=["qq"])
    assert sorted(m["id"] for m in qq_auditor.get("/messages").json()["items"]) == sorted([ids["qq"], ids["group"]])
    assert qq_auditor.get("/messages", {"conversation_id": discord_chat.session_id}).json()["count"] == 0
    assert qq_auditor.get(f"/messages/{ids['discord']}").json()["code"] == "message_not_found"
    assert qq_auditor.post(f"/messages/{ids['discord']}/cancel").status_code == 404
    assert ScheduledMessage.objects.get(pk=ids["discord"]).status == "pending"

    one_chat = client_for("one-chat", scopes=["read_all"], allowed_conversations=[qq_group.session_id])
    assert [m["id"] for m in one_chat.get("/messages").json()["items"]] == [ids["group"]]
    assert one_chat.get(f"/messages/{ids['qq']}").status_code == 404
    # A token bound to nothing reads every channel but the operators' browser chat, as it sends.
    auditor = client_for("auditor", scopes=["read_all"])
    assert ids["web"] not in [m["id"] for m in auditor.get("/messages").json()["items"]]
    assert auditor.get("/messages").json()["count"] == 3
