"""What people and adapters send can never poison the bot: the offline planner answers every message
it acts on, frames too deep or unencodable are dropped with a logged reason, a row stored too deep by an
older version still renders, and the chat page's socket answers bad frames and stays open."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from chat.components import Command, _commands, register_command
from chat.models import Message
from chat.offline import run_offline_cycle
from chat.wire.inbound import EnvelopeError, json_text_is_storable, parse_custom, parse_envelope
from core import config
from tests.chat.gateway_helpers import Adapter06, RawSocket, envelope, never_echoes
from tests.conftest import SHARED_ADAPTER_TOKENS, db, wait_for

# --- the offline planner ---------------------------------------------------------------------------


@pytest.fixture
def english():
    with config.override(bot={"language": "en"}):
        yield


@pytest.mark.django_db
@pytest.mark.parametrize(
    "text",
    [
        "/schedule 十十分钟后 喝水",
        "提醒我99999999999天后喝水",
        "/schedule in 99999999999 days x",
        "/schedule 9999-12-31T23:59:59-05:00 x",
    ],
)
def test_the_offline_planner_answers_what_it_cannot_do(make_session, english, text):
    session = make_session()
    message = Message.objects.create(
        session=session,
        direction="in",
        source_kind="inbound",
        text=text,
        segments=[{"type": "text", "data": text}],
        time=session.last_active_at,
    )
    cycle = async_to_sync(run_offline_cycle)(session=session, new_messages=[message], mentioned=False)
    assert cycle.action == "offline_error" and cycle.ended_at is not None
    answers = list(Message.objects.filter(session=session, direction="out").values_list("text", flat=True))
    assert len(answers) == 1 and answers[0].startswith(("I could not read the time", "Sorry"))


@pytest.mark.django_db
def test_a_burst_confirms_every_reminder_even_when_one_command_breaks(make_session, english):
    def broken(turn, text):
        if text == "boom":
            raise RuntimeError("a bug in a command")
        return False

    register_command(Command(name="test.broken", handle=broken, order=1))
    try:
        session = make_session()
        texts = ["remind me in 10 minutes to drink water", "boom", "/list"]
        messages = [
            Message.objects.create(
                session=session,
                direction="in",
                source_kind="inbound",
                text=t,
                segments=[{"type": "text", "data": t}],
                time=session.last_active_at,
            )
            for t in texts
        ]
        cycle = async_to_sync(run_offline_cycle)(session=session, new_messages=messages, mentioned=False)
    finally:
        _commands.pop("test.broken")
    answers = list(
        Message.objects.filter(session=session, direction="out").order_by("pk").values_list("text", flat=True)
    )
    assert len(answers) == 3
    assert (
        answers[0].startswith("OK, I'll remind you") and answers[1].startswith("Sorry") and "drink water" in answers[2]
    )
    assert cycle.ended_at is not None


# --- adapter frames ----------------------------------------------------------------------------------


def _deep(levels: int) -> dict:
    data: dict = {"leaf": 1}
    for _ in range(levels):
        data = {"x": data}
    return data


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (lambda: envelope(segments=[{"type": "mystery", "data": _deep(950)}]), "nested deeper"),
        (lambda: envelope(text="hi \ud800"), "surrogate"),
        (lambda: envelope(text="nul \x00"), "NUL"),
        (
            lambda: {
                **envelope(),
                "message_info": {
                    **envelope()["message_info"],
                    "user_info": {"platform": "qq", "user_id": 1, "user_nickname": "bad \udfff"},
                },
            },
            "surrogate",
        ),
    ],
)
def test_frames_too_deep_or_unencodable_are_refused_naming_the_problem(frame, words):
    with pytest.raises(EnvelopeError) as refused:
        parse_envelope(frame())
    assert words in str(refused.value)


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_the_json_text_shortcut_never_vouches_for_a_poisonous_frame(ensure_ascii):
    """The gateway skips the walk over a frame's values only when its JSON text shows none can be bad:
    every poisonous frame above (escaped or raw) must be sent down the full check."""
    poisonous = [
        envelope(segments=[{"type": "mystery", "data": _deep(40)}]),
        envelope(text="hi \ud800"),
        envelope(text="nul \x00"),
        envelope(text="emoji 😀 then \udfff"),
        {**envelope(), "message_info": {**envelope()["message_info"], "user_info": {"user_nickname": "x\udfff"}}},
    ]
    for frame in poisonous:
        text = json.dumps(frame, ensure_ascii=ensure_ascii)
        assert not json_text_is_storable(text), text
    plain = json.dumps(envelope(text="你好, plain text"), ensure_ascii=ensure_ascii)
    assert json_text_is_storable(plain)
    parse_envelope(json.loads(plain), storable=True)


def test_a_receipt_too_deep_is_refused():
    with pytest.raises(EnvelopeError):
        parse_custom({"message_type_name": "command_response", "content": _deep(200), "is_custom_message": True})


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
async def test_poisonous_frames_are_dropped_with_a_reason_and_the_next_is_stored(start_server):
    proc, base = start_server()
    adapter = await Adapter06(base).start()
    try:
        # A bare socket sends what a broken adapter could. 200 levels: deep enough for the bound (32),
        # shallow enough that json itself parses it at any stack depth (950 may or may not hit its
        # recursion limit first, and is dropped as not JSON then; both are covered in-process).
        frame = json.dumps(envelope(segments=[{"type": "mystery", "data": "DEEP"}]))
        deep = frame.replace('"DEEP"', '{"x": ' * 200 + "1" + "}" * 200)
        async with RawSocket(base, platform="qq-raw") as raw:
            await raw.send(deep)
        await adapter.send(envelope(text="hi \ud800"))  # the real client escapes it as JSON allows
        await adapter.send(envelope(text="after the bad ones"))

        def stored():
            try:
                return list(Message.objects.filter(direction="in").values_list("text", flat=True))
            finally:
                connection.close()

        assert await asyncio.to_thread(wait_for, lambda: stored() == ["after the bad ones"]), stored()
        # The bare socket's frame is read on a connection of its own: its drop may be logged after the
        # adapter's messages were stored.
        dropped = await asyncio.to_thread(
            wait_for, lambda: "nested deeper" in proc.output() and "surrogate" in proc.output()
        )
        assert dropped, proc.output()
    finally:
        await adapter.stop()


@pytest.mark.django_db
def test_a_row_stored_too_deep_by_an_older_version_still_renders(admin_client, make_session):
    session = make_session()
    message = Message.objects.create(
        session=session, direction="in", source_kind="inbound", text="x", segments=[], time=session.last_active_at
    )
    deep = "[" * 990 + "]" * 990  # written past the ORM, as a version without the bound could have stored it
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Message._meta.db_table} SET segments = %s WHERE id = %s", [deep, message.pk])
    assert Message.objects.get(pk=message.pk).segments[0]["data"].startswith("[stored content")
    for url in (
        reverse("admin:chat_message_change", args=[message.pk]),
        reverse("admin:chat_chatsession_change", args=[session.pk]),
        reverse("admin:chat_message_changelist"),
    ):
        assert admin_client.get(url).status_code == 200, url


# --- the chat page's socket ---------------------------------------------------------------------------


@database_sync_to_async
def _staff() -> User:
    return User.objects.create_superuser(f"op-{uuid.uuid4().hex[:6]}", password="pw")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "frame", ["[" * 100_000 + "]" * 100_000, "not json", "[1, 2]", json.dumps({"type": "send", "text": "a\ud800"})]
)
async def test_the_chat_page_socket_answers_bad_frames_and_stays_open(app, frame, caplog):
    # The `app` fixture closes the gateway this starts: its outbox claims (on PostgreSQL, a transaction
    # over several tables) must not run into the teardown's TRUNCATE, which once deadlocked with one.
    communicator = WebsocketCommunicator(app, "/chat/ws/", headers=[(b"origin", b"http://127.0.0.1")])
    communicator.scope["user"] = await _staff()
    connected, _ = await communicator.connect()
    assert connected
    with caplog.at_level(logging.WARNING):
        await communicator.send_to(text_data=frame)
        answer = await communicator.receive_json_from(timeout=5)
    assert answer["type"] == "error" and answer["error"]
    assert not any(record.exc_info for record in caplog.records)
    await communicator.send_to(text_data="{}")  # still open and answering
    assert (await communicator.receive_json_from(timeout=5))["type"] == "error"
    await communicator.disconnect()
    # Nothing of the bad frames was stored as a message.
    assert not await database_sync_to_async(Message.objects.exists)()


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
async def test_the_offline_planner_answers_impossible_times_to_a_real_adapter(shared_server):
    """The red-team's four messages, each from its own person, through the real 0.6.8 client: each one
    gets an answer saying the time cannot be read (before: no reply and an empty cycle)."""
    _, base = shared_server
    await db(never_echoes, "qq")  # known not to echo: the four answers go at once (chat.delivery_gate)
    adapter = await Adapter06(base, token=SHARED_ADAPTER_TOKENS[0]).start()
    texts = [
        "/schedule 十十分钟后 喝水",
        "提醒我99999999999天后喝水",
        "/schedule in 99999999999 days x",
        "/schedule 9999-12-31T23:59:59-05:00 x",
    ]
    try:
        for i, text in enumerate(texts):
            await adapter.send(envelope(user_id=20_000 + i, text=text))
        answers = {}
        while len(answers) < len(texts):
            frame = await adapter.next_message(timeout=30)
            user = str(frame["message_info"]["user_info"]["user_id"])
            answers[user] = "".join(s["data"] for s in frame["message_segment"]["data"] if s["type"] == "text")
        assert sorted(answers) == [str(20_000 + i) for i in range(len(texts))]
        assert all(answer.startswith("没看懂时间") for answer in answers.values()), answers
    finally:
        await adapter.stop()
