"""MaiBot's `send_service.before_send` with the example plugin `send_hooks` (real maibot-plugin-sdk,
in its runner subprocess): every outbound message waits, unclaimed by the outbox, until the handlers
have answered; a handler stops it (the message fails saying which handler, never silently) or rewrites
its text or segments, with MaiBot's kwargs. An attacker's handlers (garbage answers, a redirect to
another chat, one that never finishes, unreadable segments) change nothing they may not: the message
goes to its own chat as it was, and each failure is recorded."""

from __future__ import annotations

import asyncio

import pytest

from chat import events
from chat.models import DeliveryStatus, Message
from chat.outbox_rows import outbox_claim
from chat.services import message_send
from plugins.plugin_apis import call_api
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOOKS = "test.maibot.send-hooks"
CALLER = "test.maibot.api-caller"


def seen(host, what: str) -> list:
    return asyncio.run(call_api(host.records[CALLER], HOOKS, "seen", {"what": what}, 5.0))


def send(session, text: str, **kw) -> Message:
    return message_send(session=session, source_kind="reply", text=text, **kw)


def settled(message: Message) -> Message:
    """The row once its before_send handlers have answered (released or failed)."""
    assert wait_for(lambda: not Message.objects.get(pk=message.pk).delivery_error.startswith("held"), timeout=20)
    return Message.objects.get(pk=message.pk)


def test_before_send_gets_maibots_kwargs_and_stops_or_rewrites_the_message(load_plugins, make_session):
    host = load_plugins("send_hooks", "api_caller")
    session = make_session()
    quoted = send(session, "plain words", reply_to_platform_id="77")
    row = settled(quoted)
    assert (row.delivery_status, row.delivery_error, row.text) == ("pending", "", "plain words")
    assert seen(host, "before_send") == [
        {
            "text": "plain words",
            "session_id": session.session_id,
            "raw_message": [{"type": "reply", "data": "77"}, {"type": "text", "data": "plain words"}],
            "kwargs": {
                "reply_message_id": "77",
                "set_reply": True,
                "show_log": True,
                "storage_message": True,
                "typing": False,
            },
        }
    ]

    stopped = settled(send(session, "a forbidden line"))
    assert stopped.delivery_status == DeliveryStatus.FAILED
    assert stopped.delivery_error == f"hook_aborted: plugin:{HOOKS}:guard"

    shouted = settled(send(session, "shout: hello", reply_to_platform_id="77"))
    assert (shouted.delivery_status, shouted.text) == ("pending", "HELLO")
    assert shouted.segments == [{"type": "reply", "data": "77"}, {"type": "text", "data": "HELLO"}]

    rebuilt = settled(send(session, "segments: please"))
    assert rebuilt.segments == [{"type": "text", "data": "new "}, {"type": "text", "data": "segments"}]
    assert rebuilt.text == "new segments"

    legacy = settled(send(session, "a legacy stop here"))  # @EventHandler(POST_SEND_PRE_PROCESS)
    assert legacy.delivery_error == f"hook_aborted: plugin:{HOOKS}:legacy_stop"


def test_the_outbox_never_claims_a_message_its_handlers_still_hold(load_plugins, make_session):
    load_plugins("send_hooks", "api_caller")
    session = make_session()
    held = send(session, "hang on a moment")
    assert Message.objects.get(pk=held.pk).delivery_error.startswith("held")
    _token, claimed = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})
    assert claimed == []  # the handlers have not answered yet
    row = settled(held)  # the hanger is cut at its 1.5 s, the message goes on
    assert (row.delivery_status, row.text) == ("pending", "hang on a moment")
    _token, claimed = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})
    assert [d.message_id for d in claimed] == [held.pk]


def test_an_attackers_before_send_handlers_change_nothing_they_may_not_and_are_recorded(load_plugins, make_session):
    host = load_plugins("send_hooks", "api_caller")
    session, other = make_session(), make_session()
    events.recent_failures.clear()
    lines = ["some garbage", "redirect me", "blank it", "bad segments", "nonsense", "hang in there"]
    rows = [settled(send(session, line)) for line in lines]
    for line, row in zip(lines, rows, strict=True):
        assert (row.delivery_status, row.delivery_error, row.text) == ("pending", "", line)
        assert row.segments == [{"type": "text", "data": line}]
        assert row.session_id == session.pk
    assert not Message.objects.filter(session=other).exists()
    failures = [(f.handler.rpartition(":")[2], f.error[:58]) for f in events.recent_failures]
    assert failures == [
        ("garbage", "modified_kwargs['segments'] is str; ignored"),
        ("garbage", "modified_kwargs['text'] is blank; ignored"),
        ("garbage", "ValueError: malformed modification: message.raw_message[0]"),
        ("hanger", "PluginCallTimeout: did not finish within 1.5s"),
    ]
    errors = host.records[HOOKS].recent_errors
    assert any("HOOK_HANDLER hanger:" in e and "did not finish" in e for e in errors)


def test_a_message_whose_handlers_never_answered_fails_visibly_never_goes_out_unchecked(make_session):
    """The server holding it died mid-chain: once held past hold_limit(), the sweep fails it."""
    from datetime import timedelta

    from django.utils import timezone

    from chat.delivery_errors import HELD
    from chat.outbox_rows import outbox_sweep
    from chat.send_hooks import hold_limit

    session = make_session()
    row = send(session, "left behind")
    Message.objects.filter(pk=row.pk).update(delivery_error=HELD)
    outbox_sweep()
    assert Message.objects.get(pk=row.pk).delivery_error == HELD  # still within its limit
    Message.objects.filter(pk=row.pk).update(created_at=timezone.now() - hold_limit() - timedelta(seconds=1))
    assert outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})[1] == []
    outbox_sweep()
    row = Message.objects.get(pk=row.pk)
    assert (row.delivery_status, row.delivery_error) == ("failed", "before_send_not_run: held too long")
