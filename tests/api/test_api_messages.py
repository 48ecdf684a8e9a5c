"""The proactive message API in-process: routing rules, content types, field errors, the lifecycle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import ChatSession, Media, Message
from core import config as bot_config
from scheduling.dispatcher import deliver_due
from scheduling.models import ScheduledMessage
from tests.api.support import png_base64, png_bytes

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int, int]:
    return ScheduledMessage.objects.count(), Message.objects.count(), ChatSession.objects.count()


# --- routing --------------------------------------------------------------------------------------


def test_send_now_by_conversation_id_goes_to_the_outbox_as_a_proactive_message(api, make_session):
    session = make_session(chat_type="private")
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "你好, hello"})
    assert resp.status_code == 201, resp.content
    body = resp.json()
    # Written to the outbox, not yet handed to an adapter (none is connected): on its way.
    assert body["status"] == "sending"
    assert body["origin"] == "api"
    assert body["conversation"]["conversation_id"] == session.session_id
    assert body["content"] == {"type": "text", "format": "plain", "text": "你好, hello", "segments": []}
    # In the outbox: the adapter has not taken it yet.
    assert body["delivery"]["status"] == "pending"
    message = Message.objects.get(uid=body["delivery"]["message_id"])
    assert message.session == session
    assert message.direction == "out"
    assert message.source_kind == "proactive"
    assert message.segments == [{"type": "text", "data": "你好, hello"}]
    assert message.extra["origin"] == "api"
    task = ScheduledMessage.objects.get(pk=body["id"])
    assert task.created_via == "api" and task.created_by_token.name == "test-system"


def test_group_thread_anchor_sends_to_the_known_group(api, make_session):
    group = make_session(chat_type="group", platform="qq", group_id="555")
    resp = api.post("/messages", {"channel_type": "qq", "channel_thread_id": "555", "text": "群公告"})
    assert resp.status_code == 201, resp.content
    assert resp.json()["conversation"] == {
        "conversation_id": group.session_id,
        "channel_type": "qq",
        "chat_type": "group",
        "channel_thread_id": "555",
        "channel_user_id": None,
        "name": group.group_name,
        "last_active_at": resp.json()["conversation"]["last_active_at"],
    }
    assert Message.objects.get(session=group).text == "群公告"


def test_unknown_group_thread_is_404_and_creates_nothing(api, make_session):
    make_session(chat_type="group", platform="qq", group_id="555")
    before = counts()
    resp = api.post("/messages", {"channel_type": "qq", "channel_thread_id": "999", "text": "hi"})
    assert resp.status_code == 404
    assert resp.json() == {
        "code": "thread_not_found",
        "message": "the bot knows no group '999' on 'qq'",
        "field": "channel_thread_id",
    }
    # The same id on another platform is another thread.
    resp = api.post("/messages", {"channel_type": "wechat", "channel_thread_id": "555", "text": "hi"})
    assert resp.status_code == 404 and resp.json()["code"] == "thread_not_found"
    assert counts() == before


def test_channel_user_creates_the_private_conversation_once(api):
    resp = api.post("/messages", {"channel_type": "qq", "channel_user_id": "10001", "text": "first"})
    assert resp.status_code == 201, resp.content
    conv = resp.json()["conversation"]
    assert conv["chat_type"] == "private" and conv["channel_user_id"] == "10001"
    resp2 = api.post("/messages", {"channel_type": "qq", "channel_user_id": 10001, "text": "second"})
    assert resp2.status_code == 201, resp2.content
    assert resp2.json()["conversation"]["conversation_id"] == conv["conversation_id"]
    session = ChatSession.objects.get(session_id=conv["conversation_id"])
    assert list(session.messages.values_list("text", flat=True)) == ["first", "second"]


def test_channel_user_reaches_an_existing_private_chat(api, make_session):
    session = make_session(chat_type="private", platform="qq", user_id="42")
    resp = api.post("/messages", {"channel_type": "qq", "channel_user_id": "42", "text": "hi"})
    assert resp.json()["conversation"]["conversation_id"] == session.session_id
    assert ChatSession.objects.count() == 1


def test_unknown_conversation_id_is_404(api):
    resp = api.post("/messages", {"conversation_id": "nope", "text": "hi"})
    assert resp.status_code == 404
    assert resp.json()["code"] == "conversation_not_found"
    assert resp.json()["field"] == "conversation_id"
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    "anchor",
    [
        {"conversation_id": "x", "channel_type": "qq", "channel_thread_id": "1"},
        {"conversation_id": "x", "channel_thread_id": "1"},
        {"conversation_id": "x", "channel_type": "qq", "channel_user_id": "1"},
        {"channel_type": "qq", "channel_thread_id": "1", "channel_user_id": "2"},
        {"conversation_id": "x", "channel_type": "qq"},
    ],
)
def test_two_anchors_are_a_conflicting_anchor(api, make_session, anchor):
    make_session(chat_type="group", group_id="1")
    before = counts()
    resp = api.post("/messages", {**anchor, "text": "hi"})
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "conflicting_anchor"
    assert body["field"] in {"channel_thread_id", "channel_user_id", "channel_type"}
    assert counts() == before


@pytest.mark.parametrize("anchor", [{}, {"channel_type": "qq"}, {"conversation_id": ""}])
def test_no_anchor_is_missing_anchor(api, anchor):
    resp = api.post("/messages", {**anchor, "text": "hi"})
    assert resp.status_code == 400
    assert resp.json()["code"] == "missing_anchor"


@pytest.mark.parametrize("anchor", [{"channel_thread_id": "1"}, {"channel_user_id": "1"}])
def test_thread_or_user_without_channel_type_is_refused(api, anchor):
    resp = api.post("/messages", {**anchor, "text": "hi"})
    assert resp.status_code == 400
    assert resp.json() == {
        "code": "missing_channel_type",
        "message": f"{next(iter(anchor))} needs channel_type (the platform, e.g. qq)",
        "field": "channel_type",
    }
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize("origin", ["api", "scheduler", "connector", "system"])
def test_origin_is_recorded(api, make_session, origin):
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "origin": origin})
    assert resp.status_code == 201
    assert resp.json()["origin"] == origin
    assert ScheduledMessage.objects.get().origin == origin


# --- field errors ---------------------------------------------------------------------------------


def test_schema_errors_name_the_field_in_our_error_shape(api, make_session):
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "origin": "email"})
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "validation_error"
    assert body["field"] == "origin"
    assert body["errors"][0]["field"] == "origin"
    resp = api.post("/messages", {"conversaton_id": session.session_id, "text": "x"})
    assert resp.status_code == 400 and resp.json()["field"] == "conversaton_id"
    resp = api.post("/messages", {"conversation_id": session.session_id, "type": "rich_text", "segments": [{}]})
    assert resp.status_code == 400 and resp.json()["field"] == "segments[0].type"


def test_malformed_json_is_invalid_json(api):
    resp = api.post("/messages", raw=b'{"text": "unterminated')
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid_json"


def test_text_limits(api, make_session, default_bot_config):
    session = make_session()
    before = counts()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "字" * 1025})
    assert resp.status_code == 400
    assert resp.json()["code"] == "text_too_long" and resp.json()["field"] == "text"
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "   "})
    assert resp.status_code == 400 and resp.json()["code"] == "empty_text"
    assert counts() == before
    assert api.post("/messages", {"conversation_id": session.session_id, "text": "字" * 1024}).status_code == 201
    with bot_config.override(api={"max_text_length": 5}):
        resp = api.post("/messages", {"conversation_id": session.session_id, "text": "123456"})
        assert resp.json()["code"] == "text_too_long"


def test_send_at_errors_name_send_at(api, make_session):
    session = make_session()
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "send_at": past})
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid_send_at" and resp.json()["field"] == "send_at"
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "send_at": "2099-01-01T10:00"})
    assert resp.json()["code"] == "invalid_send_at"
    assert "time zone" in resp.json()["message"]
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "send_at": "tomorrow-ish"})
    assert resp.json()["code"] == "validation_error" and resp.json()["field"] == "send_at"
    assert counts()[0] == 0


def test_private_conversation_is_not_created_when_content_is_bad(api):
    resp = api.post("/messages", {"channel_type": "qq", "channel_user_id": "77", "text": ""})
    assert resp.status_code == 400 and resp.json()["code"] == "empty_text"
    resp = api.post(
        "/messages",
        {"channel_type": "qq", "channel_user_id": "77", "text": "x", "send_at": "2000-01-01T00:00:00+00:00"},
    )
    assert resp.status_code == 400 and resp.json()["code"] == "invalid_send_at"
    assert counts() == (0, 0, 0)


# --- content types --------------------------------------------------------------------------------


def test_markdown_is_sent_as_written_and_its_format_recorded(api, make_session):
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "**提醒** 开会", "format": "markdown"})
    assert resp.status_code == 201
    assert resp.json()["content"]["format"] == "markdown"
    assert Message.objects.get().segments == [{"type": "text", "data": "**提醒** 开会"}]
    assert api.get(f"/messages/{resp.json()['id']}").json()["content"]["format"] == "markdown"


def test_image_base64_is_stored_and_sent_as_an_image_segment(api, make_session):
    session = make_session()
    resp = api.post(
        "/messages",
        {"conversation_id": session.session_id, "type": "image", "text": "看图", "image": {"base64": png_base64()}},
    )
    assert resp.status_code == 201, resp.content
    media = Media.objects.get()
    assert media.kind == "image" and media.mime == "image/png"
    assert resp.json()["content"]["segments"] == [
        {"type": "text", "data": "看图", "sha256": None, "size": None},
        {"type": "image", "data": None, "sha256": media.sha256, "size": len(png_bytes())},
    ]
    message = Message.objects.get()
    # The outbox puts the stored bytes on the wire (see test_api_adapter for the frame).
    assert message.segments == [{"type": "text", "data": "看图"}, {"type": "image", "data": {"media": media.sha256}}]
    assert media.file.read() == png_bytes()


def test_image_url_is_sent_as_imageurl_and_never_fetched(api, make_session):
    session = make_session()
    url = "https://images.example.invalid/cat.png"
    resp = api.post("/messages", {"conversation_id": session.session_id, "type": "image", "image": {"url": url}})
    assert resp.status_code == 201, resp.content
    assert Message.objects.get().segments == [{"type": "imageurl", "data": url}]
    assert Media.objects.count() == 0


@pytest.mark.parametrize(
    ("image", "code", "field"),
    [
        ({"base64": "!!!not base64!!!"}, "invalid_image", "image.base64"),
        ({"base64": "aGVsbG8gd29ybGQ="}, "invalid_image", "image.base64"),  # "hello world": not an image
        ({"url": "ftp://example.invalid/x.png"}, "invalid_image", "image"),
        ({"url": "https://a/x.png", "base64": "aGk="}, "invalid_image", "image"),
        ({}, "invalid_image", "image"),
    ],
)
def test_bad_images_are_refused_by_field(api, make_session, image, code, field):
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, "type": "image", "image": image})
    assert resp.status_code == 400, resp.content
    assert (resp.json()["code"], resp.json()["field"]) == (code, field)
    assert counts()[:2] == (0, 0)


def test_image_too_large(api, make_session):
    session = make_session()
    with bot_config.override(api={"max_image_bytes": 100}):
        resp = api.post(
            "/messages",
            {"conversation_id": session.session_id, "type": "image", "image": {"base64": png_base64() * 3}},
        )
    assert resp.status_code == 400 and resp.json()["code"] == "image_too_large"


def test_rich_text_segments_become_maim_message_segments(api, make_session):
    session = make_session()
    resp = api.post(
        "/messages",
        {
            "conversation_id": session.session_id,
            "type": "rich_text",
            "segments": [
                {"type": "mention", "user_id": "10001", "name": "Alice"},
                {"type": "text", "text": "请看 please see"},
                {"type": "image", "base64": png_base64()},
                {"type": "image", "url": "http://img.example.invalid/a.jpg"},
            ],
        },
    )
    assert resp.status_code == 201, resp.content
    message = Message.objects.get()
    assert message.segments == [
        {"type": "text", "data": "@Alice "},
        {"type": "text", "data": "请看 please see"},
        {"type": "image", "data": {"media": Media.objects.get().sha256}},
        {"type": "imageurl", "data": "http://img.example.invalid/a.jpg"},
    ]
    assert resp.json()["content"]["type"] == "rich_text"
    assert resp.json()["content"]["text"] == "@Alice 请看 please see"


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"type": "rich_text", "segments": []}, "invalid_content", "segments"),
        ({"type": "rich_text", "segments": [{"type": "text", "text": " "}]}, "empty_text", "segments[0].text"),
        ({"type": "rich_text", "segments": [{"type": "mention"}]}, "invalid_content", "segments[0].user_id"),
        ({"type": "rich_text", "text": "x", "segments": [{"type": "text", "text": "y"}]}, "invalid_content", "text"),
        ({"type": "text", "text": "x", "image": {"url": "https://a/b.png"}}, "invalid_content", "image"),
        ({"type": "image", "image": {"url": "https://a/b.png"}, "format": "markdown"}, "invalid_content", "format"),
        ({"type": "image"}, "invalid_content", "image"),
    ],
)
def test_content_rules_by_type(api, make_session, body, code, field):
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, **body})
    assert resp.status_code == 400, resp.content
    assert (resp.json()["code"], resp.json()["field"]) == (code, field)


# --- lifecycle ------------------------------------------------------------------------------------


def test_scheduled_message_is_pending_then_delivered_by_the_dispatcher_as_proactive(api, make_session):
    session = make_session(chat_type="group")
    send_at = timezone.now() + timedelta(minutes=5)
    resp = api.post(
        "/messages", {"conversation_id": session.session_id, "text": "稍后 later", "send_at": send_at.isoformat()}
    )
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["status"] == "pending" and body["delivery"] is None
    assert body["send_at"].endswith("+08:00")  # shown in the bot's time zone, with its offset
    assert Message.objects.count() == 0
    report = deliver_due(now=send_at + timedelta(seconds=1))
    assert report.sent == 1
    detail = api.get(f"/messages/{body['id']}").json()
    assert detail["status"] == "sending"  # in the outbox: no adapter has taken it
    assert detail["delivery"]["status"] == "pending"
    assert Message.objects.get().source_kind == "proactive"


def test_cancel_pending_only_with_reason(api, make_session):
    session = make_session()
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    task_id = api.post("/messages", {"conversation_id": session.session_id, "text": "x", "send_at": later}).json()["id"]
    resp = api.post(f"/messages/{task_id}/cancel", {"reason": "plans changed 计划有变"})
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "cancelled"
    assert resp.json()["cancel_reason"] == "plans changed 计划有变"
    assert resp.json()["cancelled_at"]
    again = api.post(f"/messages/{task_id}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "not_pending"
    sent_id = api.post("/messages", {"conversation_id": session.session_id, "text": "now"}).json()["id"]
    resp = api.post(f"/messages/{sent_id}/cancel")
    assert resp.status_code == 409 and resp.json()["code"] == "not_pending"
    assert api.get(f"/messages/{sent_id}").json()["status"] == "sending"
    assert deliver_due(now=timezone.now() + timedelta(hours=2)).sent == 0


def test_unknown_message_is_404(api, make_session):
    assert api.get("/messages/sm_nope").json()["code"] == "message_not_found"
    assert api.post("/messages/sm_nope/cancel").status_code == 404
    # A scheduled message the planner made is not an API message.
    from scheduling.services import SYSTEM, scheduled_message_create

    task = scheduled_message_create(
        session=make_session(), send_at=timezone.now() + timedelta(hours=1), message_text="x", acted_by=SYSTEM
    ).task
    assert api.get(f"/messages/{task.pk}").status_code == 404


def test_delivery_failure_reason_is_visible(api, make_session):
    session = make_session()
    body = api.post("/messages", {"conversation_id": session.session_id, "text": "x"}).json()
    Message.objects.filter(uid=body["delivery"]["message_id"]).update(
        delivery_status="failed", delivery_error="adapter_offline"
    )
    detail = api.get(f"/messages/{body['id']}").json()
    assert detail["delivery"]["status"] == "failed" and detail["delivery"]["error"] == "adapter_offline"


def test_list_filters_and_pagination(api, make_session):
    a, b = make_session(), make_session(chat_type="group")
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    for i in range(3):
        api.post("/messages", {"conversation_id": a.session_id, "text": f"a{i}", "origin": "scheduler"})
    api.post("/messages", {"conversation_id": b.session_id, "text": "b-later", "send_at": later})
    all_ = api.get("/messages").json()
    assert all_["count"] == 4 and all_["items"][0]["content"]["text"] == "b-later"
    assert api.get("/messages", {"status": "pending"}).json()["count"] == 1
    assert api.get("/messages", {"conversation_id": a.session_id}).json()["count"] == 3
    assert api.get("/messages", {"origin": "scheduler"}).json()["count"] == 3
    soon = (timezone.now() + timedelta(minutes=30)).isoformat()
    assert api.get("/messages", {"send_after": soon}).json()["count"] == 1
    assert api.get("/messages", {"send_before": soon}).json()["count"] == 3
    assert api.get("/messages", {"created_after": soon}).json()["count"] == 0
    page = api.get("/messages", {"limit": 3}).json()
    assert len(page["items"]) == 3 and page["next_offset"] == 3
    last = api.get("/messages", {"limit": 3, "offset": 3}).json()
    assert len(last["items"]) == 1 and last["next_offset"] is None
    bad = api.get("/messages", {"limit": 0})
    assert bad.status_code == 400 and bad.json()["field"] == "limit"
    assert api.get("/messages", {"status": "bogus"}).json()["field"] == "status"


def test_conversations_lookup(api, make_session):
    p = make_session(chat_type="private", platform="qq", user_id="10001")
    g = make_session(chat_type="group", platform="qq", group_id="555")
    make_session(chat_type="private", platform="wechat", user_id="10001")
    assert api.get("/conversations").json()["count"] == 3
    found = api.get("/conversations", {"channel_type": "qq", "channel_user_id": "10001"}).json()
    assert [c["conversation_id"] for c in found["items"]] == [p.session_id]
    found = api.get("/conversations", {"channel_type": "qq", "channel_thread_id": "555"}).json()
    assert [c["conversation_id"] for c in found["items"]] == [g.session_id]
    assert api.get("/conversations", {"chat_type": "group"}).json()["count"] == 1
    assert api.get("/conversations", {"limit": 2}).json()["next_offset"] == 2


def test_too_many_pending_is_409(api, make_session):
    session = make_session()
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    with bot_config.override(scheduling={"max_pending_per_session": 1}):
        assert (
            api.post("/messages", {"conversation_id": session.session_id, "text": "1", "send_at": later}).status_code
            == 201
        )
        resp = api.post("/messages", {"conversation_id": session.session_id, "text": "2", "send_at": later})
    assert resp.status_code == 409 and resp.json()["code"] == "too_many_pending"


def test_values_the_database_cannot_store_are_field_errors(api, make_session):
    # PostgreSQL refuses NUL in text: without this check it was a 503 on POST and a 500 on GET.
    session = make_session()
    resp = api.post("/messages", {"conversation_id": session.session_id, "text": "a\x00b"})
    assert resp.status_code == 400 and resp.json()["field"] == "text"
    resp = api.get("/messages", {"conversation_id": "a\x00b"})
    assert resp.status_code == 400 and resp.json()["field"] == "conversation_id"
    resp = api.get("/messages", {"created_after": "0001-01-01T00:00:00+05:00"})
    assert resp.status_code == 400 and resp.json()["field"] == "created_after"
    assert counts()[:2] == (0, 0)


def test_a_body_over_the_upload_limit_is_413(api, make_session):
    session = make_session()
    huge = "A" * (3 * 1024 * 1024)
    resp = api.post("/messages", {"conversation_id": session.session_id, "type": "image", "image": {"base64": huge}})
    assert resp.status_code == 413
    assert resp.json()["code"] == "payload_too_large"
    assert counts()[:2] == (0, 0)
