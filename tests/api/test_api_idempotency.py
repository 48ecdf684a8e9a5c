"""Idempotency-Key: a repeat gets the first answer and sends nothing; another body under one key is 409."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from api.access import api_token_create
from api.models import IdempotencyRecord
from chat.models import Message
from scheduling.models import ScheduledMessage
from tests.api.support import ApiClient

pytestmark = pytest.mark.django_db


def test_same_key_and_body_replays_the_first_answer_and_sends_once(api, make_session):
    session = make_session()
    body = {"conversation_id": session.session_id, "text": "只发一次 once"}
    first = api.post("/messages", body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201
    # Same JSON, other key order and spacing: the same request.
    raw = json.dumps({"text": "只发一次 once", "conversation_id": session.session_id}, indent=2).encode()
    again = api.post("/messages", raw=raw, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 201
    assert again.content == first.content
    assert ScheduledMessage.objects.count() == 1
    assert Message.objects.count() == 1


def test_same_key_with_another_body_is_409_and_sends_nothing(api, make_session):
    session = make_session()
    api.post("/messages", {"conversation_id": session.session_id, "text": "a"}, headers={"Idempotency-Key": "k"})
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "b"}, headers={"Idempotency-Key": "k"})
    assert resp.status_code == 409
    assert resp.json()["code"] == "idempotency_key_reused"
    assert resp.json()["field"] == "Idempotency-Key"
    assert list(Message.objects.values_list("text", flat=True)) == ["a"]


def test_an_error_answer_is_replayed_too(api):
    body = {"conversation_id": "missing", "text": "x"}
    first = api.post("/messages", body, headers={"Idempotency-Key": "e"})
    again = api.post("/messages", body, headers={"Idempotency-Key": "e"})
    assert first.status_code == again.status_code == 404
    assert first.content == again.content
    assert IdempotencyRecord.objects.get(key="e").status_code == 404


def test_keys_belong_to_their_token(api, make_session):
    session = make_session()
    other = ApiClient(api_token_create(name="other")[1])
    body = {"conversation_id": session.session_id, "text": "x"}
    assert api.post("/messages", body, headers={"Idempotency-Key": "shared"}).status_code == 201
    assert other.post("/messages", body, headers={"Idempotency-Key": "shared"}).status_code == 201
    assert Message.objects.count() == 2


def test_without_a_key_every_request_sends(api, make_session):
    session = make_session()
    body = {"conversation_id": session.session_id, "text": "x"}
    api.post("/messages", body)
    api.post("/messages", body)
    assert Message.objects.count() == 2


def test_cancel_with_a_key_replays_instead_of_not_pending(api, make_session):
    session = make_session()
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    task_id = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "send_at": later}).json()["id"]
    first = api.post(f"/messages/{task_id}/cancel", {"reason": "r"}, headers={"Idempotency-Key": "c"})
    again = api.post(f"/messages/{task_id}/cancel", {"reason": "r"}, headers={"Idempotency-Key": "c"})
    assert first.status_code == again.status_code == 200
    assert first.content == again.content
    assert api.post(f"/messages/{task_id}/cancel").json()["code"] == "not_pending"


def test_overlong_key_is_a_field_error(api, make_session):
    session = make_session()
    resp = api.post(
        "/messages", {"conversation_id": session.session_id, "text": "x"}, headers={"Idempotency-Key": "k" * 300}
    )
    assert resp.status_code == 400
    assert resp.json()["field"] == "Idempotency-Key"
    assert Message.objects.count() == 0


def test_a_key_is_remembered_for_a_day(api, make_session):
    session = make_session()
    body = {"conversation_id": session.session_id, "text": "x"}
    api.post("/messages", body, headers={"Idempotency-Key": "daily"})
    api.post("/messages", body, headers={"Idempotency-Key": "daily"})
    assert Message.objects.count() == 1
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(hours=25))
    assert api.post("/messages", body, headers={"Idempotency-Key": "daily"}).status_code == 201
    assert Message.objects.count() == 2
    assert IdempotencyRecord.objects.count() == 1
