"""Ingest inside the ASGI application: stored messages are announced with `inbound_stored`, in batches
when frames arrive fast, and the announced rows are the stored ones."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from chat.gateway import close_old_connection, get_gateway
from chat.models import AdapterConnection, Message
from chat.services import inbound_stored
from core.adapter_tokens import parse_adapter_tokens
from tests.chat.gateway_helpers import envelope
from tests.conftest import db, wait_for_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def announced():
    batches: list[list[Message]] = []

    async def listener(sender, messages, **kwargs):
        batches.append(list(messages))

    inbound_stored.connect(listener, dispatch_uid="test-listener")
    yield batches
    inbound_stored.disconnect(dispatch_uid="test-listener")


async def test_stored_messages_are_announced_to_the_planner_hook_in_batches(settings, announced):
    settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens("tok", name="T")
    from maibot.asgi import application

    comm = WebsocketCommunicator(application, "/ws", headers=[(b"platform", b"qq"), (b"authorization", b"tok")])
    connected, _ = await comm.connect()
    assert connected
    try:
        await comm.send_json_to(envelope(text="lone message"))
        await wait_for_async(lambda: announced, what="the lone message announced")
        assert [[m.text for m in batch] for batch in announced] == [["lone message"]]

        for i in range(300):
            await comm.send_json_to(envelope(text=f"burst {i}", user_id=1000 + i % 7))
        await wait_for_async(lambda: sum(len(b) for b in announced) == 301, what="the burst announced")
        # A burst is written in fewer transactions than it has messages, and nothing is lost or reordered.
        assert len(announced) < 301
        texts = [m.text for batch in announced[1:] for m in batch]
        assert texts == [f"burst {i}" for i in range(300)]
        first = announced[1][0]
        stored = await db(lambda: Message.objects.select_related("session").get(pk=first.pk))
        assert stored.uid == first.uid and stored.text == "burst 0" and stored.session.user_id == "1000"
        assert first.session_id == stored.session_id
    finally:
        await comm.disconnect()
        # The connection's close is recorded by the gateway's writer thread before aclose stops it.
        await wait_for_async(
            lambda: not AdapterConnection.objects.filter(disconnected_at__isnull=True).exists(),
            what="the connection's close recorded",
        )
        await get_gateway().aclose()
        # Sync inbound_stored receivers run in asgiref's shared thread: release its connection too.
        await sync_to_async(close_old_connection)()


def test_a_session_deleted_while_known_to_the_ingest_is_created_again(db):
    from chat.ingest import InboundItem, inbound_messages_store
    from chat.models import ChatSession
    from chat.wire.inbound import parse_envelope

    def item(text: str) -> InboundItem:
        return InboundItem(platform="qq", message=parse_envelope(envelope(user_id=4242, text=text)))

    first = inbound_messages_store(items=[item("one"), item("two")])
    assert [m.text for m in first.stored] == ["one", "two"]
    ChatSession.objects.filter(user_id="4242").delete()  # an operator removes the conversation
    again = inbound_messages_store(items=[item("three")])
    assert [m.text for m in again.stored] == ["three"] and again.rejected == 0
    session = ChatSession.objects.get(user_id="4242")
    assert list(session.messages.values_list("text", flat=True)) == ["three"]
