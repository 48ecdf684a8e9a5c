"""The gateway in-process, the fast tier: Channels' WebsocketCommunicator drives the project's ASGI
application (no daphne, no subprocess) over the 0.6.x plain websocket, and the hot paths of ingest and
delivery cost a fixed number of queries whatever the batch size. The same paths against a real daphne
and the real maim_message clients are in test_gateway_mm06.py / test_gateway_mm07.py."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import deque

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.consumers import ChatPageConsumer
from chat.delivery_errors import DeliveryError
from chat.gateway import get_gateway
from chat.ingest import InboundItem, inbound_messages_store
from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Message
from chat.outbox_rows import outbox_claim, outbox_finish, outbox_sweep
from chat.services import Outbound, message_send, messages_send, session_get_or_create
from chat.wire.inbound import parse_envelope
from core.aio import db as hop
from core.config import BotConfig, set_config
from tests.chat.gateway_helpers import TIMEOUT, adapter, envelope
from tests.conftest import db, wait_for_async

# The gateway stores and delivers on threads of its own: they must see the test's rows committed.
pytestmark = pytest.mark.django_db(transaction=True)


async def _connected(application) -> WebsocketCommunicator:
    comm = adapter(application)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    # Registered (and recorded) once its connection record exists.
    await wait_for_async(
        lambda: AdapterConnection.objects.filter(disconnected_at__isnull=True).exists(), what="recorded"
    )
    return comm


async def test_an_envelope_is_stored_as_a_message_of_its_session(app):
    comm = await _connected(app)
    try:
        await comm.send_json_to(envelope(user_id=10001, nickname="Alice", text="hello 你好", message_id=1234567890))
        stored = await wait_for_async(
            lambda: (
                Message.objects.filter(direction="in", platform_message_id="1234567890")
                .select_related("session")
                .first()
            ),
            what="the inbound message stored",
        )
    finally:
        await comm.disconnect(timeout=TIMEOUT)
    assert (stored.text, stored.source_kind, stored.sender_id) == ("hello 你好", "user", "10001")
    assert stored.segments == [{"type": "text", "data": "hello 你好"}]
    session = stored.session
    assert (session.platform, session.chat_type, session.user_id, session.user_nickname) == (
        "qq",
        "private",
        "10001",
        "Alice",
    )
    record = await db(lambda: AdapterConnection.objects.get(platform="qq"))
    assert record.protocol == "ws" and "reply" in record.accept_format


async def test_a_reply_goes_out_as_the_exact_text_frame_adapters_expect(app):
    session = await db(
        session_get_or_create, platform="qq", chat_type="private", user_id="10001", user_nickname="Alice"
    )
    comm = await _connected(app)
    try:
        out = await db(
            message_send, session=session, source_kind="reply", text="hi Alice 你好", reply_to_platform_id="1234567890"
        )
        text = await comm.receive_from(timeout=TIMEOUT)
        sent = await wait_for_async(
            lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.SENT).first()
        )
    finally:
        await comm.disconnect(timeout=TIMEOUT)
    # Byte for byte: key order, integer ids, non-ASCII unescaped, the quoted message first.
    expected = (
        (
            '{"message_info": {"platform": "qq", "message_id": "UID", "time": TIME, '
            '"user_info": {"platform": "qq", "user_id": 10001, "user_nickname": "Alice", "user_cardname": ""}, '
            '"additional_config": {}}, '
            '"message_segment": {"type": "seglist", "data": [{"type": "reply", "data": "1234567890"}, '
            '{"type": "text", "data": "hi Alice 你好"}]}, "raw_message": "hi Alice 你好"}'
        )
        .replace("UID", str(out.uid))
        .replace("TIME", repr(out.time.timestamp()))
    )
    assert text == expected
    assert sent.sent_at is not None and sent.delivered_at is None


async def test_a_waiting_claim_builds_its_frames_with_what_the_platform_accepts_by_then(app):
    """A deliverer round can start (woken by the connection) and its claim wait on the outbox's thread
    (a busy database) while the adapter's first message says what the platform accepts and a reply is
    written. The reply the claim picks up is built for that accept_format: no voice, no quote."""
    comm = await _connected(app)
    deliverer = get_gateway().deliverer
    loop, claim_made, release = asyncio.get_running_loop(), asyncio.Event(), threading.Event()

    def claim_held_on_the_thread(**kwargs):
        # Made (its arguments taken), then held on the outbox thread before it reads any row.
        loop.call_soon_threadsafe(claim_made.set)
        release.wait(2 * TIMEOUT)
        return outbox_claim(**kwargs)

    deliverer._claim = hop(claim_held_on_the_thread, executor=deliverer.executor)
    try:
        deliverer.wake()
        await asyncio.wait_for(claim_made.wait(), TIMEOUT)
        await comm.send_json_to(envelope(user_id=10001, text="hi", accept_format=["text"]))
        stored = await wait_for_async(
            lambda: Message.objects.filter(direction="in").select_related("session").first(), what="stored"
        )
        out = await db(
            message_send,
            session=stored.session,
            source_kind="reply",
            segments=[{"type": "text", "data": "look"}, {"type": "voice", "data": "AAAA"}],
            reply_to_platform_id="123",
        )
        release.set()
        frame = json.loads(await comm.receive_from(timeout=TIMEOUT))
    finally:
        release.set()
        await comm.disconnect(timeout=TIMEOUT)
    assert frame["message_info"]["message_id"] == str(out.uid)
    assert frame["message_segment"]["data"] == [{"type": "text", "data": "look"}]


@pytest.mark.parametrize("token", ["wrong", None])
async def test_a_bad_token_is_accepted_then_closed_with_1008(app, token):
    comm = adapter(app, token=token)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected  # as the 0.6.x reference server: accept, then close
    assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 1008}
    await comm.wait(timeout=TIMEOUT)
    assert not await db(lambda: AdapterConnection.objects.exists())


async def test_bad_frames_are_dropped_and_the_connection_keeps_working(app, caplog):
    comm = await _connected(app)
    try:
        await comm.send_to(text_data="this is not json {")
        await comm.send_json_to([1, 2, 3])
        await comm.send_to(bytes_data=b"\xff\xfe binary garbage")
        nobody = envelope(text="nobody")
        nobody["message_info"]["user_info"] = None
        await comm.send_json_to(nobody)
        await comm.send_json_to({"is_custom_message": True, "message_type_name": "something_new", "content": {}})
        await comm.send_json_to(envelope(text="still here 还在"))
        await wait_for_async(lambda: Message.objects.filter(text="still here 还在").exists(), what="the good message")
        # Still open: nothing was sent back, no close in particular.
        assert await comm.receive_nothing(timeout=0.05)
    finally:
        await comm.disconnect(timeout=TIMEOUT)
    assert await db(lambda: list(Message.objects.filter(direction="in").values_list("text", flat=True))) == [
        "still here 还在"
    ]
    log = caplog.text
    for needle in (
        "not JSON",
        "expected a JSON object, got list",
        "binary frame",
        "a private message needs user_info.user_id",
        "custom message 'something_new'",
    ):
        assert needle in log


async def test_frames_waiting_for_the_writer_are_kept_as_text_and_decoded_in_order_when_stored(
    app, caplog, monkeypatch
):
    """Under a flood the frames that wait for the writer are their JSON text (which the garbage
    collector never walks), decoded just before their batch is stored: same order, bad ones dropped
    with their warning, and a frame whose decoding fails for any reason costs only itself."""
    from chat.gateway import get_gateway
    from chat.gateway.writer import FrameKind
    from chat.wire import inbound

    comm = await _connected(app)
    writer = get_gateway().writer
    hold = threading.Event()
    # The writer stores on its one thread: while this occupies it, every frame waits in the queue.
    blocker = writer.executor.submit(hold.wait, TIMEOUT)
    real_parse = inbound.parse_envelope

    def parse(data, **kwargs):
        if "boom" in json.dumps(data):
            raise RuntimeError("a bug in decoding")
        return real_parse(data, **kwargs)

    monkeypatch.setattr("chat.gateway.frames.parse_envelope", parse)
    try:
        await comm.send_json_to(envelope(text="first 第一"))

        conn = get_gateway().connections.adapters["qq"]

        async def taken() -> bool:
            return conn.backlog == 1 and not writer._queue

        # The first is taken at once, and its batch waits for the thread.
        await wait_for_async(taken, what="the first frame taken by the writer")
        await comm.send_to(text_data="this is not json {")
        await comm.send_json_to(envelope(text="boom"))
        await comm.send_json_to(envelope(text="second 第二", user_id=10002))
        await comm.send_json_to(envelope(text="third 第三"))

        async def four_queued() -> bool:
            return len(writer._queue) == 4

        await wait_for_async(four_queued, what="four frames queued")
        assert [q.kind for q in writer._queue] == [FrameKind.TEXT] * 4
        assert not await db(lambda: Message.objects.filter(direction="in").exists())
        hold.set()
        await wait_for_async(
            lambda: Message.objects.filter(direction="in").count() == 3, what="the three good frames stored"
        )
    finally:
        hold.set()
        blocker.result(timeout=TIMEOUT)
        await comm.disconnect(timeout=TIMEOUT)
    rows = await db(
        lambda: list(Message.objects.filter(direction="in").order_by("id").values_list("text", "sender_id"))
    )
    assert rows == [("first 第一", "10001"), ("second 第二", "10002"), ("third 第三", "10001")]
    assert "not JSON" in caplog.text and "decoding it failed" in caplog.text
    assert writer._queue == deque()


async def test_the_chat_page_refuses_text_longer_than_the_configured_limit(app):
    set_config(BotConfig(gateway={"browser_max_text_length": 10}))
    user = await db(lambda: get_user_model().objects.create_user("operator", password="x", is_staff=True))
    comm = WebsocketCommunicator(ChatPageConsumer.as_asgi(), "/chat/ws/")
    comm.scope["user"] = user
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    try:
        await comm.send_json_to({"type": "send", "text": "x" * 11})
        assert await comm.receive_json_from(timeout=TIMEOUT) == {
            "type": "error",
            "error": "the message is longer than 10 characters",
        }
        await comm.send_json_to({"type": "send", "text": "x" * 10})
        frame = await comm.receive_json_from(timeout=TIMEOUT)  # its own message, confirmed once stored
        assert (frame["type"], frame["direction"], frame["text"]) == ("message", "in", "x" * 10)
    finally:
        await comm.disconnect(timeout=TIMEOUT)


# --- query counts on the hot paths (no sockets: the services the gateway's threads call) -------------


def _items(n: int, users: list[str], start: int = 0) -> list[InboundItem]:
    return [
        InboundItem(
            platform="qq", message=parse_envelope(envelope(user_id=users[i % len(users)], text=f"m{start + i}"))
        )
        for i in range(n)
    ]


@pytest.mark.django_db
def test_storing_a_batch_for_known_sessions_costs_the_same_queries_whatever_its_size():
    users = [str(uuid.uuid4().int % 10**12) for _ in range(5)]
    inbound_messages_store(items=_items(5, users))  # the sessions become known
    with CaptureQueriesContext(connection) as small:
        assert len(inbound_messages_store(items=_items(5, users, 5)).stored) == 5
    with CaptureQueriesContext(connection) as large:
        assert len(inbound_messages_store(items=_items(400, users, 10)).stored) == 400
    assert len(small) == len(large), [q["sql"][:80] for q in large]
    # One INSERT … RETURNING for every row (their ids come back with it), one UPDATE of the sessions'
    # activity, and the savepoint around them.
    assert len(large) == 4
    assert Message.objects.filter(direction="in").count() == 410
    assert ChatSession.objects.count() == 5


@pytest.mark.django_db
def test_claiming_a_batch_costs_the_same_queries_whatever_its_size(make_session):
    sessions = [make_session() for _ in range(3)]

    def queue(n: int) -> None:
        messages_send([Outbound(session=sessions[i % 3], source_kind="proactive", text=f"m{i}") for i in range(n)])

    def claim() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            token, batch = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={})
        assert all(d.frame and d.error is None for d in batch)
        outbox_finish(token=token, sent=[d.message_id for d in batch], released=[], failed={})
        return len(batch), len(queries)

    queue(3)
    small = claim()
    queue(300)
    large = claim()
    assert (small[0], large[0]) == (3, 300)
    # The pending ids, the claiming UPDATE, the claimed rows, their sessions.
    assert small[1] == large[1] == 4


@pytest.mark.django_db
def test_delivery_failures_are_recorded_with_their_enum_codes(make_session):
    from datetime import timedelta

    from django.utils import timezone

    session = make_session()
    waiting, unsendable = messages_send(
        [
            Outbound(session=session, source_kind="proactive", text="waits for an adapter"),
            Outbound(session=session, source_kind="proactive", segments=[{"type": "voice", "data": "AAAA"}]),
        ]
    )
    token, batch = outbox_claim(adapter_platforms=["qq"], web_users=[], accept_formats={"qq": ["text"]})
    errors = {d.message_id: d.error for d in batch}
    assert errors == {waiting.pk: None, unsendable.pk: DeliveryError.UNSUPPORTED}
    outbox_finish(token=token, sent=[], released=[waiting.pk], failed={unsendable.pk: errors[unsendable.pk]})
    outbox_sweep(now=timezone.now() + timedelta(seconds=3601))
    assert dict(Message.objects.values_list("pk", "delivery_error")) == {
        waiting.pk: "adapter_offline",
        unsendable.pk: "unsupported_segments",
    }
    assert json.dumps([DeliveryError.ADAPTER_OFFLINE]) == '["adapter_offline"]'


# --- the cross-process wake-up, published from sync code ------------------------------------------------


class RecordingLayer:
    """A channel layer that records group_send calls, with the thread each ran on."""

    published: list[tuple[str, str, dict]] = []
    done = threading.Event()

    def __init__(self, **config) -> None:
        pass

    async def group_send(self, group: str, message: dict) -> None:
        RecordingLayer.published.append((threading.current_thread().name, group, message))
        RecordingLayer.done.set()


def test_a_send_from_sync_code_publishes_the_wake_on_the_background_loop(settings, make_session):
    # As in a qcluster worker: no event loop in the calling thread, and none of a gateway in the process.
    settings.REDIS_URL = "redis://wake-test.invalid"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.RecordingLayer"}}
    RecordingLayer.published.clear()
    RecordingLayer.done.clear()
    session = make_session()
    message_send(session=session, source_kind="proactive", text="wake the servers")  # commits: the hook runs
    assert RecordingLayer.done.wait(10)
    assert RecordingLayer.published == [("maibot-background", "maibot.outbox", {"type": "outbox.wake"})]
