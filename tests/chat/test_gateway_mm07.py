"""The adapter gateway with the real maim_message 0.7.x client (Socket.IO, from .venv-mm07) on a live daphne."""

from __future__ import annotations

import pytest

from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Message
from chat.services import message_send
from tests.chat.gateway_helpers import MM07_PYTHON, Adapter07, RawSocket, envelope
from tests.conftest import SHARED_ADAPTER_TOKENS, db, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

TOKEN = SHARED_ADAPTER_TOKENS[0]


async def frame_of(adapter: Adapter07, message: Message, *, answering: ChatSession) -> dict:
    """The frame that carries `message`. The bot's own answers in the private session `answering` may
    come first: the shared server has no model, so its offline planner answers the test's private
    message with a notice once chat.debounce_seconds (1 s) of quiet have passed, which a slow machine
    reaches before the test's next step. Any other frame fails the test."""

    def an_answer(uid: str) -> bool:
        replies = Message.objects.filter(session_id=answering.pk, direction="out", source_kind="reply")
        return replies.filter(uid=uid).exclude(pk=message.pk).exists()

    while True:
        frame = await adapter.next_message()
        uid = frame["message_info"]["message_id"]
        if uid == str(message.uid):
            return frame
        answer = await db(an_answer, uid)
        assert answer, f"an unexpected frame before the one of {message.text!r}: {frame}"


@pytest.fixture
def server(shared_server):
    # `make test` builds the 0.7.x client's environment; without it these tests fail, never skip.
    if not MM07_PYTHON.exists():
        pytest.fail(f"{MM07_PYTHON} is missing: run `make venv-mm07`")
    return shared_server[1]


async def test_socketio_client_round_trip_private_and_group(server):
    adapter = Adapter07(server, token=TOKEN)
    try:
        assert await adapter.start() == "connected"
        await adapter.command({"cmd": "send", "frame": envelope(user_id=10001, text="你好 from 0.7", message_id=42)})
        stored = await wait_for_async(lambda: Message.objects.filter(direction="in", platform_message_id="42").first())
        assert stored.text == "你好 from 0.7"
        session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
        assert (session.chat_type, session.user_id) == ("private", "10001")
        record = await db(lambda: AdapterConnection.objects.get(platform="qq", disconnected_at__isnull=True))
        assert record.protocol == "socketio"

        out = await db(message_send, session=session, source_kind="reply", text="hi from the bot")
        frame = await frame_of(adapter, out, answering=session)
        assert frame["message_info"]["message_id"] == str(out.uid)
        assert frame["message_info"]["user_info"]["user_id"] == 10001
        assert frame["message_segment"]["data"] == [{"type": "text", "data": "hi from the bot"}]
        await wait_for_async(lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.SENT).exists())
        await adapter.command({"cmd": "echo", "echo": str(out.uid), "actual_id": 555})
        await wait_for_async(lambda: Message.objects.filter(pk=out.pk, platform_message_id="555").exists())

        await adapter.command({"cmd": "send", "frame": envelope(user_id=7, group_id=888, group_name="群", text="g")})
        group_msg = await wait_for_async(
            lambda: Message.objects.filter(direction="in", session__chat_type="group").first()
        )
        group = await db(lambda: ChatSession.objects.get(pk=group_msg.session_id))
        assert (group.group_id, group.group_name) == ("888", "群")
        to_group = await db(message_send, session=group, source_kind="reply", text="to the group")
        frame = await frame_of(adapter, to_group, answering=session)
        assert frame["message_info"]["group_info"]["group_id"] == 888
    finally:
        await adapter.stop()
    await wait_for_async(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=False).exists())


async def test_socketio_bad_token_is_refused(server):
    for token in ("wrong-token", None):
        adapter = Adapter07(server, token=token)
        try:
            assert await adapter.start() == "refused"
        finally:
            await adapter.stop()
    assert not await db(lambda: AdapterConnection.objects.exists())


async def test_a_new_connection_of_the_platform_replaces_the_socketio_one(server, make_session):
    adapter = Adapter07(server, token=TOKEN)
    try:
        assert await adapter.start() == "connected"
        async with RawSocket(server, token=TOKEN) as newer:
            assert (await adapter.next_event())["event"] == "disconnected"
            session = await db(make_session, user_id="60006")
            out = await db(message_send, session=session, source_kind="reply", text="to the newer one")
            frame = await newer.recv_json()
            assert frame["message_info"]["message_id"] == str(out.uid)
            # The replaced Socket.IO client does not fight back for the platform (it runs with reconnection
            # off, tests/mm07/adapter.py): the newer connection still works and is the only open one.
            await newer.send_json(envelope(text="still the live one"))
            await wait_for_async(lambda: Message.objects.filter(text="still the live one").exists())
            assert await db(lambda: AdapterConnection.objects.count()) == 2
            assert await db(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=True).count()) == 1
        records = await db(lambda: list(AdapterConnection.objects.order_by("id").values_list("protocol", "close_code")))
        assert records[0] == ("socketio", 1000)
    finally:
        await adapter.stop()
