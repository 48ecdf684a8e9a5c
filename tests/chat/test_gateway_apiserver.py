"""maim_message's API-Server mode on /ws, with the real 0.7.5 WebSocketClient (Socket.IO, x-apikey /
x-platform, APIMessageBase packages; from .venv-mm07) and the real 0.6.8 one (plain websocket, in this
process) against a live daphne; and MAIBOT_ADAPTER_ALLOW_FROM admitting a legacy client without a token."""

from __future__ import annotations

import pytest

from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Message
from chat.services import message_send
from tests.chat.gateway_helpers import (
    LEGACY_PYTHON,
    MM07_PYTHON,
    Adapter06,
    Adapter07,
    ApiClient,
    envelope,
    never_echoes,
)
from tests.conftest import SHARED_ADAPTER_TOKENS, db, shared_adapter_token, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

KEY = SHARED_ADAPTER_TOKENS[1]


@pytest.fixture
def server(shared_server):
    if not MM07_PYTHON.exists():
        pytest.fail(f"{MM07_PYTHON} is missing: run `make venv-mm07`")
    return shared_server


async def test_api_server_client_with_its_key_gets_the_bots_reply_and_its_echo_marks_it_delivered(server):
    log, base = server
    client = ApiClient(base, api_key=KEY)
    try:
        assert await client.start() == "connected"
        frame = envelope(user_id=20002, text="hello over the API", message_id=77)
        await client.command({"cmd": "send", "frame": frame})
        stored = await wait_for_async(lambda: Message.objects.filter(direction="in", platform_message_id="77").first())
        assert stored.text == "hello over the API"
        session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
        assert (session.platform, session.chat_type, session.user_id) == ("qq", "private", "20002")
        record = await db(lambda: AdapterConnection.objects.get(platform="qq", disconnected_at__isnull=True))
        assert record.protocol == "socketio"

        # The (offline) planner answers; the reply reaches the client, turned back by MessageConverter
        # into the legacy message the NapCat adapter's send handler reads: user_info is the recipient.
        reply = await client.next_message(timeout=60)
        assert reply["message_info"]["user_info"]["user_id"] == 20002
        assert reply["message_info"]["platform"] == "qq"
        out = await db(lambda: Message.objects.get(uid=reply["message_info"]["message_id"]))
        assert out.direction == "out" and out.session_id == session.pk
        await wait_for_async(lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.SENT).exists())

        await client.command({"cmd": "echo", "echo": reply["message_info"]["message_id"], "actual_id": 9001})
        delivered = await wait_for_async(
            lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.DELIVERED).first()
        )
        assert delivered.platform_message_id == "9001"

        # A group message: the group and the bot's own account, in receiver_info on the wire.
        await client.command({"cmd": "send", "frame": envelope(user_id=7, group_id=889, group_name="API 群", text="g")})
        group_msg = await wait_for_async(
            lambda: Message.objects.filter(direction="in", session__group_id="889").first()
        )
        group = await db(lambda: ChatSession.objects.get(pk=group_msg.session_id))
        assert group.chat_type == "group"
        sent = await db(message_send, session=group, source_kind="reply", text="to the API group")
        frame = await client.next_message()
        assert frame["message_info"]["message_id"] == str(sent.uid)
        assert frame["message_info"]["group_info"]["group_id"] == 889
        assert frame["message_info"]["user_info"] is not None  # the NapCat adapter drops a group message without
        assert frame["message_segment"]["data"] == [{"type": "text", "data": "to the API group"}]
    finally:
        await client.stop()
    await wait_for_async(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=False).exists())
    assert KEY not in log.output()


async def test_api_server_client_with_a_wrong_key_is_refused_and_nothing_is_stored(start_server):
    # A server of its own: the refusal log is per process, and the shared one may have logged this
    # address and reason within the minute.
    log, base = start_server("wrongkey", MAIBOT_ADAPTER_TOKENS=KEY)
    for _ in range(3):
        client = ApiClient(base, api_key="not-the-key")
        try:
            first = await client.start()
            assert first == "refused", first
        finally:
            await client.stop()
    assert not await db(lambda: AdapterConnection.objects.exists())
    assert not await db(lambda: ChatSession.objects.exists())
    assert not await db(lambda: Message.objects.exists())
    # Three refusals from one address for one reason: logged once.
    log.wait_for_output("refused: invalid token")
    assert log.output().count("refused: invalid token") == 1
    assert "not-the-key" not in log.output()


async def test_the_068_api_server_client_over_the_plain_websocket(server):
    _, base = server
    # Known not to echo until it does: ours goes right after the planner's answer (chat.delivery_gate).
    await db(never_echoes, "qq068")
    client = ApiClient(base, api_key=shared_adapter_token("qq068"), platform="qq068", python=LEGACY_PYTHON)
    try:
        assert await client.start() == "connected"
        assert client.version == "0.6.8"
        await client.command(
            {"cmd": "send", "frame": envelope(platform="qq068", user_id=30003, text="from 0.6.8", message_id=5)}
        )
        stored = await wait_for_async(lambda: Message.objects.filter(direction="in", text="from 0.6.8").first())
        session = await db(lambda: ChatSession.objects.get(pk=stored.session_id))
        record = await db(lambda: AdapterConnection.objects.get(platform="qq068", disconnected_at__isnull=True))
        assert record.protocol == "ws"
        # The offline planner's answer comes first; then ours.
        sent = await db(message_send, session=session, source_kind="reply", text="back to 0.6.8")
        while (frame := await client.next_message(timeout=60))["message_info"]["message_id"] != str(sent.uid):
            pass
        assert frame["message_info"]["user_info"]["user_id"] == 30003
        await client.command({"cmd": "echo", "echo": str(sent.uid), "actual_id": 31})
        await wait_for_async(
            lambda: Message.objects.filter(pk=sent.pk, delivery_status=DeliveryStatus.DELIVERED).exists()
        )
    finally:
        await client.stop()


async def test_a_legacy_client_without_a_token_is_admitted_from_an_allowed_network(start_server):
    # Tokens for other platforms only: a platform with a token is reachable with it alone.
    _, base = start_server("allow", MAIBOT_ADAPTER_TOKENS="discord:some-token", MAIBOT_ADAPTER_ALLOW_FROM="127.0.0.0/8")
    adapter = await Adapter06(base, token=None).start()
    try:
        await adapter.send(envelope(text="no token, allowed network"))
        await wait_for_async(lambda: Message.objects.filter(text="no token, allowed network").exists())
    finally:
        await adapter.stop()
    # The 0.7 legacy client (the NapCat adapter's legacy mode: token=None) too; a wrong token is still refused.
    legacy07 = Adapter07(base)
    try:
        assert await legacy07.start() == "connected"
    finally:
        await legacy07.stop()
    wrong = Adapter07(base, token="wrong")
    try:
        assert await wrong.start() == "refused"
    finally:
        await wrong.stop()


async def test_without_allow_from_a_legacy_client_without_a_token_is_refused(server):
    _, base = server
    legacy07 = Adapter07(base)
    try:
        assert await legacy07.start() == "refused"
    finally:
        await legacy07.stop()
    assert not await db(lambda: AdapterConnection.objects.exists())


def test_a_bad_allow_from_stops_start_up_naming_the_entry(tmp_path):
    import subprocess
    import sys

    from tests.chat.gateway_helpers import ROOT

    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "MAIBOT_DATA_DIR": str(tmp_path),
            "HOME": str(tmp_path),
            "MAIBOT_ADAPTER_ALLOW_FROM": "127.0.0.0/8, 192.168.1.7/24",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "MAIBOT_ADAPTER_ALLOW_FROM: '192.168.1.7/24' is not a network in CIDR notation" in result.stderr
