"""API tokens: bearer auth (none, bad, revoked → 401, nothing changes), the admin and the command."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from api.access import api_token_revoke, hash_token
from chat.models import ApiToken, ChatSession, Message
from scheduling.models import ScheduledMessage
from tests.api.support import ApiClient

pytestmark = pytest.mark.django_db

SEND = {"channel_type": "qq", "channel_user_id": "10001", "text": "hi"}


def nothing_written() -> bool:
    return not (ScheduledMessage.objects.exists() or Message.objects.exists() or ChatSession.objects.exists())


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        (None, "not_authenticated"),
        ("Basic dXNlcjpwYXNz", "not_authenticated"),
        ("Bearer", "invalid_token"),
        ("Bearer mbt_not-a-real-token", "invalid_token"),
    ],
)
def test_missing_or_bad_token_is_401_and_nothing_changes(token_pair, authorization, code):
    client = ApiClient(None)
    headers = {"Authorization": authorization} if authorization else {}
    resp = client.post("/messages", SEND, headers=headers)
    assert resp.status_code == 401
    assert resp.json()["code"] == code
    assert resp["WWW-Authenticate"].startswith("Bearer")
    for path in ("/messages", "/conversations", "/messages/sm_x"):
        assert client.get(path, headers=headers).status_code == 401
    assert nothing_written()
    token_pair[0].refresh_from_db()
    assert token_pair[0].last_used_at is None


def test_revoked_token_is_401_and_nothing_changes(api, token_pair):
    token, _raw = token_pair
    assert api.get("/conversations").status_code == 200
    assert api_token_revoke(token=token) is True
    assert api_token_revoke(token=token) is False
    resp = api.post("/messages", SEND)
    assert resp.status_code == 401
    assert resp.json() == {"code": "token_revoked", "message": "this token has been revoked"}
    assert api.get("/conversations").status_code == 401
    assert nothing_written()


def test_last_use_is_recorded(api, token_pair):
    token, _ = token_pair
    assert token.last_used_at is None
    api.get("/conversations")
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_create_api_token_command_prints_it_once_and_stores_only_a_hash():
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_token", "监控 monitoring", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    assert raw.startswith("mbt_") and len(raw) > 40
    assert "shown only this once" in err.getvalue()
    token = ApiToken.objects.get(name="监控 monitoring")
    assert token.token_hash == hash_token(raw) and raw not in (token.token_hash, token.prefix)
    assert ApiClient(raw).get("/conversations").status_code == 200
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_api_token", "监控 monitoring", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.fixture
def operator_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser(username="op", password="pw-123456"))
    return client


def test_admin_add_shows_the_token_once_and_it_works(operator_client):
    add = operator_client.get("/admin/chat/apitoken/add/")
    assert add.status_code == 200
    assert 'name="name"' in add.content.decode()
    # What the browser sends: the name and the default scopes, checked on the form.
    resp = operator_client.post("/admin/chat/apitoken/add/", {"name": "crm", "scopes": ["send", "read_own", "cancel"]})
    assert resp.status_code == 200
    page = resp.content.decode()
    assert "will not be shown again" in page
    raw = re.search(r'<code id="api-token"[^>]*>([^<]+)</code>', page).group(1)
    token = ApiToken.objects.get(name="crm")
    assert token.created_by.username == "op"
    assert token.token_hash == hash_token(raw)
    assert ApiClient(raw).post("/messages", SEND).status_code == 201
    # Never again: not on the change page, not in the list.
    change = operator_client.get(f"/admin/chat/apitoken/{token.pk}/change/").content.decode()
    listing = operator_client.get("/admin/chat/apitoken/").content.decode()
    assert raw not in change and raw not in listing
    assert token.prefix in listing
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_admin_revoke_action_makes_the_token_fail(operator_client, token_pair):
    token, raw = token_pair
    resp = operator_client.post(
        "/admin/chat/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert "Revoked: test-system" in resp.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    resp = ApiClient(raw).post("/messages", SEND)
    assert resp.status_code == 401 and resp.json()["code"] == "token_revoked"
    assert nothing_written()


def test_api_messages_and_their_lifecycle_show_in_the_scheduled_message_admin(operator_client, api, make_session):
    session = make_session()
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    sent = api.post("/messages", {"conversation_id": session.session_id, "text": "现在", "origin": "connector"}).json()
    pending = api.post("/messages", {"conversation_id": session.session_id, "text": "稍后", "send_at": later}).json()
    api.post(f"/messages/{pending['id']}/cancel", {"reason": "用户取消 user cancelled"})
    listing = operator_client.get("/admin/scheduling/scheduledmessage/", {"created_via": "api"}).content.decode()
    assert sent["id"] in listing and pending["id"] in listing
    cancelled = api.get(f"/messages/{pending['id']}").json()
    assert cancelled["status"] == "cancelled", cancelled
    resp = operator_client.get(reverse("admin:scheduling_scheduledmessage_change", args=[quote(pending["id"])]))
    assert resp.status_code == 200, (resp.status_code, resp.headers.get("Location"))
    page = resp.content.decode()
    assert "用户取消 user cancelled" in page and "test-system" in page
    resp = operator_client.get(reverse("admin:scheduling_scheduledmessage_change", args=[quote(sent["id"])]))
    assert resp.status_code == 200, (resp.status_code, resp.headers.get("Location"))
    page = resp.content.decode()
    assert "connector" in page
