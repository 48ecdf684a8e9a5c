"""The adapter gateway with the real maim_message 0.6.8 client (plain websocket) against a live daphne."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest
import websockets
from django.conf import settings

from chat.models import AdapterConnection, ChatSession, CommandResponse, DeliveryStatus, Media, Message
from chat.services import Outbound, message_send, messages_send
from tests.chat.gateway_helpers import Adapter06, RawSocket, envelope, never_echoes
from tests.conftest import SHARED_ADAPTER_TOKENS, db, shared_adapter_token, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

TOKEN = SHARED_ADAPTER_TOKENS[0]


@pytest.fixture
def server(shared_server):
    return shared_server[1]


async def test_private_text_is_stored_and_reply_goes_out_with_receipt(server):
    adapter = await Adapter06(server, token=TOKEN).start()
    try:
        await adapter.send(envelope(user_id=10001, nickname="Alice", text="hello 你好", message_id=1234567890))
        stored = await wait_for_async(
            lambda: Message.objects.filter(direction="in", platform_message_id="1234567890").first(),
            what="the inbound message stored",
        )
        assert stored.text == "hello 你好"
        assert stored.source_kind == "user"
        assert stored.segments == [{"type": "text", "data": "hello 你好"}]
        session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
        assert (session.platform, session.chat_type, session.user_id, session.user_nickname) == (
            "qq",
            "private",
            "10001",
            "Alice",
        )

        # The bot answers through the send service, quoting the user's message.
        out = await db(
            message_send, session=session, source_kind="reply", text="hi Alice", reply_to_platform_id="1234567890"
        )
        frame = await adapter.next_message()
        assert frame["message_info"]["message_id"] == str(out.uid)
        assert frame["message_info"]["user_info"]["user_id"] == 10001
        assert "group_info" not in frame["message_info"]
        assert frame["message_segment"] == {
            "type": "seglist",
            "data": [{"type": "reply", "data": "1234567890"}, {"type": "text", "data": "hi Alice"}],
        }
        sent = await wait_for_async(
            lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.SENT).first(), what="sent"
        )
        assert sent.sent_at is not None and sent.delivered_at is None

        await adapter.echo(str(out.uid), 987654321)
        delivered = await wait_for_async(
            lambda: Message.objects.filter(pk=out.pk, platform_message_id="987654321").first(),
            what="the echo receipt recorded",
        )
        assert delivered.delivery_status == DeliveryStatus.DELIVERED and delivered.delivered_at >= delivered.sent_at
        await adapter.router.send_custom_message(
            "qq", "command_response", {"command_name": "GROUP_BAN", "success": True, "timestamp": 1.0}
        )
        resp = await wait_for_async(
            lambda: CommandResponse.objects.filter(platform="qq").first(), what="command response"
        )
        assert resp.command_name == "GROUP_BAN" and resp.success
        record = await wait_for_async(
            lambda: next(
                (r for r in AdapterConnection.objects.filter(platform="qq") if "reply" in r.accept_format), None
            ),
            what="the connection record shows the accept_format",
        )
        assert record.protocol == "ws" and record.disconnected_at is None
    finally:
        await adapter.stop()
    await wait_for_async(
        lambda: AdapterConnection.objects.filter(platform="qq", disconnected_at__isnull=False).exists(),
        what="the disconnect recorded",
    )


async def test_group_message_creates_group_session_and_reply_names_the_group(server):
    from maim_message import MessageBase

    adapter = await Adapter06(server, token=TOKEN).start()
    try:
        first = envelope(user_id="20002", nickname="Bob", group_id=555, group_name="g", text="大家好")
        # This adapter names the receiver: the bot's own account, which the server learns.
        first["message_info"]["receiver_info"] = {"user_info": {"platform": "qq", "user_id": 3355}}
        await adapter.send(first)
        await adapter.send(envelope(user_id="20003", nickname="Carol", group_id=555, group_name="g", text="hi"))
        stored = await wait_for_async(
            lambda: (
                list(Message.objects.filter(direction="in").order_by("pk")) if Message.objects.count() == 2 else None
            ),
            what="both stored",
        )
        session = await db(lambda: ChatSession.objects.get(pk=stored[0].session_id))
        assert stored[1].session_id == session.pk
        # The group is the session; who spoke is on each message.
        assert (session.chat_type, session.group_id, session.group_name, session.user_id, session.user_nickname) == (
            "group",
            "555",
            "g",
            "",
            "",
        )
        assert [(m.sender_id, m.sender_nickname) for m in stored] == [("20002", "Bob"), ("20003", "Carol")]
        out = await db(message_send, session=session, source_kind="reply", text="hello group")
        frame = await adapter.next_message()
        info = frame["message_info"]
        assert info["group_info"] == {"platform": "qq", "group_id": 555, "group_name": "g"}
        # The bot itself in user_info, as MaiBot's core sends it: the NapCat adapter sends to the group only
        # when both are present (`if group_info and user_info`), and drops the message otherwise.
        assert info["user_info"] == {"platform": "qq", "user_id": 3355, "user_nickname": "麦麦", "user_cardname": ""}
        assert info["message_id"] == str(out.uid)
        parsed = MessageBase.from_dict(frame).message_info
        assert parsed.group_info and parsed.user_info and parsed.group_info.group_id == 555
    finally:
        await adapter.stop()


async def test_bad_token_is_accepted_then_closed_with_1008(server):
    for token in ("wrong", None):
        async with RawSocket(server, token=token) as ws:
            assert await ws.closed_with() == 1008
    # The real client does not get a usable connection either, and nothing is recorded.
    assert not await db(lambda: AdapterConnection.objects.exists())


async def test_second_connection_replaces_the_first_which_is_closed_1000(server):
    async with RawSocket(server, token=TOKEN) as first:
        await wait_for_async(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=True).exists())
        async with RawSocket(server, token=TOKEN) as second:
            assert await first.closed_with() == 1000
            # The new connection is the live one: outbound messages go to it.
            await second.send_json(envelope(text="from the second"))
            stored = await wait_for_async(lambda: Message.objects.filter(direction="in").first())
            session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
            out = await db(message_send, session=session, source_kind="reply", text="to the second")
            frame = await second.recv_json()
            assert frame["message_info"]["message_id"] == str(out.uid)
    records = await db(lambda: list(AdapterConnection.objects.order_by("id").values_list("close_code", flat=True)))
    assert records[0] == 1000


async def test_offline_messages_wait_and_go_out_on_reconnect_in_order(server, make_session):
    await db(never_echoes, "qq")  # an adapter that does not echo, known as one (chat.delivery_gate)
    session = await db(make_session, user_id="30003")
    first = await db(message_send, session=session, source_kind="scheduled_send", text="one")
    second = await db(message_send, session=session, source_kind="reply", text="two")
    # A probe on another platform: once its message is delivered, the server's outbox has run a round
    # after the two were stored, and they are still waiting for their (offline) adapter.
    probe_session = await db(make_session, platform="probe", user_id="30004")
    async with RawSocket(server, platform="probe", token=shared_adapter_token("probe")) as probe:
        await wait_for_async(lambda: AdapterConnection.objects.filter(platform="probe").exists())
        marker = await db(message_send, session=probe_session, source_kind="reply", text="probe")
        assert (await probe.recv_json())["message_info"]["message_id"] == str(marker.uid)
    assert await db(lambda: Message.objects.filter(delivery_status="pending").count()) == 2
    adapter = await Adapter06(server, token=TOKEN).start()
    try:
        a = await adapter.next_message()
        b = await adapter.next_message()
        assert [a["message_info"]["message_id"], b["message_info"]["message_id"]] == [str(first.uid), str(second.uid)]
        assert a["message_info"]["user_info"]["user_id"] == 30003
        await wait_for_async(lambda: Message.objects.filter(session=session, delivery_status="sent").count() == 2)
        # Never twice: nothing else arrives.
        with pytest.raises(TimeoutError):
            await adapter.next_message(timeout=1.0)
    finally:
        await adapter.stop()


@pytest.mark.skipif(not settings.REDIS_URL, reason="the channel-layer wake-up needs REDIS_URL")
async def test_with_redis_a_send_from_another_process_is_delivered_at_once(server, make_session):
    # This test process is "another process" (like qcluster): its sends reach the server only through
    # the channel layer group; the server's own safety poll is 5 s, so each prompt arrival is the wake-up.
    await db(never_echoes, "qq")  # known not to echo: each message goes at once (chat.delivery_gate)
    adapter = await Adapter06(server, token=TOKEN).start()
    try:
        session = await db(make_session, user_id="50005")
        for pause in (0.3, 1.3, 0.7):
            await asyncio.sleep(pause)  # kept: the scenario's pacing between sends, not a wait for a condition
            out = await db(message_send, session=session, source_kind="proactive", text=f"after {pause}")
            started = time.monotonic()
            frame = await adapter.next_message(timeout=10)
            assert frame["message_info"]["message_id"] == str(out.uid)
            assert time.monotonic() - started < 2.5
    finally:
        await adapter.stop()


async def test_outbound_follows_the_adapters_accept_format_and_inlines_media(server, make_session):
    png = b"\x89PNG\r\n\x1a\n" + b"outbound image" * 10
    # A platform of its own: the server keeps a platform's accept_format across connections. Known not
    # to echo: its second message goes at once (chat.delivery_gate).
    await db(never_echoes, "narrow")
    adapter = await Adapter06(server, platform="narrow", token=shared_adapter_token("narrow")).start()
    try:
        # This adapter cannot quote and takes no voice: it says so in its messages' format_info. Its
        # image is stored by the server; the bot sends it back by reference.
        image_seg = {"type": "image", "data": base64.b64encode(png).decode()}
        await adapter.send(
            envelope(platform="narrow", user_id=70007, segments=[image_seg], accept_format=["text", "image"])
        )
        stored = await wait_for_async(lambda: Message.objects.filter(direction="in").first())
        session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
        media = await db(lambda: Media.objects.get(kind="image"))
        out = await db(
            message_send,
            session=session,
            source_kind="reply",
            segments=[
                {"type": "text", "data": "look"},
                {"type": "image", "data": {"media": media.sha256}},
                {"type": "voice", "data": "AAAA"},
            ],
            reply_to_platform_id="123",
        )
        frame = await adapter.next_message()
        assert frame["message_info"]["message_id"] == str(out.uid)
        assert frame["message_segment"]["data"] == [
            {"type": "text", "data": "look"},
            {"type": "image", "data": base64.b64encode(png).decode()},
        ]
        only_voice = await db(
            message_send, session=session, source_kind="reply", segments=[{"type": "voice", "data": "AAAA"}]
        )
        failed = await wait_for_async(
            lambda: Message.objects.filter(pk=only_voice.pk, delivery_status=DeliveryStatus.FAILED).first()
        )
        assert failed.delivery_error == "unsupported_segments"
        with pytest.raises(TimeoutError):
            await adapter.next_message(timeout=1.0)
    finally:
        await adapter.stop()


@pytest.mark.long
async def test_two_server_processes_never_send_a_message_twice(start_server, make_session):
    _, first_base = start_server("web1", MAIBOT_ADAPTER_TOKENS=TOKEN)
    _, second_base = start_server("web2", MAIBOT_ADAPTER_TOKENS=TOKEN)
    received: list[str] = []
    close_codes: list[int | None] = []

    async def collect(ws: RawSocket) -> None:
        try:
            while True:
                frame = await ws.recv_json(timeout=30)
                received.append(frame["message_info"]["message_id"])
        except websockets.ConnectionClosed as exc:  # replaced by the other process's connection (Redis)
            close_codes.append(exc.rcvd.code if exc.rcvd else None)

    session = await db(make_session, user_id="80008")
    await db(never_echoes, "qq")  # known not to echo: the burst flows at once (chat.delivery_gate)
    async with RawSocket(first_base, token=TOKEN) as one:
        await wait_for_async(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=True).exists())
        async with RawSocket(second_base, token=TOKEN) as two:
            await wait_for_async(lambda: AdapterConnection.objects.count() == 2)
            readers = [asyncio.create_task(collect(one)), asyncio.create_task(collect(two))]
            sent = []
            for i in range(10):
                batch = [Outbound(session=session, source_kind="proactive", text=f"m{i}-{j}") for j in range(30)]
                sent.extend(await db(messages_send, batch))
            await wait_for_async(lambda: Message.objects.filter(delivery_status="sent").count() == 300, timeout=60)

            async def all_received() -> bool:
                return len(received) >= 300

            await wait_for_async(all_received, what="the 300 frames at the adapters")
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    assert sorted(received) == sorted(str(m.uid) for m in sent)
    # With Redis the processes talk: the newer connection replaced the older one in the other process.
    assert close_codes == ([1000] if settings.REDIS_URL else [])


async def test_an_undeliverable_message_fails_alone_and_the_next_one_goes_out(server, make_session):
    session = await db(make_session, user_id="90009")
    broken = await db(
        message_send, session=session, source_kind="reply", segments=[{"type": "emoji", "data": {"media": "0" * 64}}]
    )
    fine = await db(message_send, session=session, source_kind="reply", text="the next one")
    adapter = await Adapter06(server, token=TOKEN).start()
    try:
        frame = await adapter.next_message()
        assert frame["message_info"]["message_id"] == str(fine.uid)
        failed = await wait_for_async(lambda: Message.objects.filter(pk=broken.pk, delivery_status="failed").first())
        assert failed.delivery_error == "media_missing"
    finally:
        await adapter.stop()
