"""Adapter identity, as an attacker holding one platform's token tries it: tokens bound to platforms
(MAIBOT_ADAPTER_TOKENS), a connection that speaks for its own platform only, echoes that settle only a
message of their platform that was handed over. The fast tier: parsing, the rules, in-process sockets.
The real maim_message clients (0.6.8 Router, 0.7.5 Socket.IO, the API-Server WebSocketClient) against
the shared live daphne: the `live` tests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from api.access import api_token_create
from chat.gateway.auth import adapter_auth_problem
from chat.ingest import AdapterFrames, adapter_frames_store
from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Message
from chat.outbox_rows import outbox_claim, outbox_finish
from chat.services import Outbound, message_send, messages_send
from core.adapter_tokens import AdapterToken, parse_adapter_tokens
from tests.api.test_api_live import http
from tests.chat.gateway_helpers import (
    DISCORD_TOKEN,
    MM07_PYTHON,
    ROOT,
    TIMEOUT,
    TOKEN,
    Adapter06,
    Adapter07,
    ApiClient,
    RawSocket,
    adapter,
    envelope,
)
from tests.conftest import SHARED_ADAPTER_TOKENS, db, shared_adapter_token, wait_for_async

NAME = "MAIBOT_ADAPTER_TOKENS"


# --- the format ----------------------------------------------------------------------------------------
def test_tokens_are_bound_to_their_platform_and_a_bare_token_is_qqs():
    tokens = parse_adapter_tokens(" qq:a1 , discord:b2,bare3,,qq:a:b , tg.v2:c-4 ", name=NAME)
    assert tokens == (
        AdapterToken("qq", "a1"),
        AdapterToken("discord", "b2"),
        AdapterToken("qq", "bare3"),
        AdapterToken("qq", "a:b"),  # a token with a colon is written with its platform
        AdapterToken("tg.v2", "c-4"),
    )
    assert parse_adapter_tokens("", name=NAME) == ()
    # Listed twice for one platform: nothing ambiguous, kept once.
    assert parse_adapter_tokens("qq:x,x", name=NAME) == (AdapterToken("qq", "x"),)
    # The settings object is printed by debug pages: a token's repr has no secret.
    assert "a1" not in repr(tokens) and "qq" in repr(tokens)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("qq:s3cret-x,discord:s3cret-x", "entry 2: platform 'discord' has the same token as entry 1 (platform 'qq')"),
        ("s3cret-x,tg:s3cret-x", "entry 2: platform 'tg' has the same token as entry 1 (platform 'qq')"),
        ("qq:ok1,:s3cret-x", "entry 2: what comes before the first ':' is not a platform name"),
        ("s3cret x:y", "entry 1: what comes before the first ':' is not a platform name"),
        ("web:s3cret-x", "entry 1: platform 'web' is reserved for the browser chat page"),
        ("qq:", "entry 1: platform 'qq' has an empty token"),
        ("qq:s3cret\tx", "entry 1: the token for platform 'qq' contains whitespace"),
    ],
)
def test_an_ambiguous_token_list_is_refused_naming_the_entry_never_the_token(value, problem):
    with pytest.raises(ImproperlyConfigured) as refused:
        parse_adapter_tokens(value, name=NAME)
    assert str(refused.value).startswith(f"{NAME}: {problem}")
    assert "s3cret" not in str(refused.value)


def test_an_ambiguous_token_list_stops_start_up(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "MAIBOT_DATA_DIR": str(tmp_path),
            "HOME": str(tmp_path),
            NAME: "qq:dup-s3cret,discord:dup-s3cret",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "platform 'discord' has the same token as entry 1 (platform 'qq')" in result.stderr
    assert "dup-s3cret" not in result.stderr + result.stdout


# --- the rules -----------------------------------------------------------------------------------------
@pytest.fixture
def bound(settings):
    settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens(f"qq:{TOKEN},discord:{DISCORD_TOKEN}", name=NAME)
    settings.MAIBOT_ADAPTER_ALLOW_FROM = ()
    return settings


@pytest.mark.parametrize("api_server", [False, True])
def test_a_token_admits_its_own_platform_only(bound, api_server):
    check = dict(client_host="203.0.113.9", api_server=api_server)
    assert adapter_auth_problem(platform="qq", token=TOKEN, **check) is None
    assert adapter_auth_problem(platform="discord", token=DISCORD_TOKEN, **check) is None
    refused = adapter_auth_problem(platform="qq", token=DISCORD_TOKEN, **check)
    assert refused == "the token is bound to platform discord, not 'qq'"
    # Nor as a platform nobody has a token for, nor from loopback.
    assert adapter_auth_problem(platform="telegram", token=DISCORD_TOKEN, **check) is not None
    assert adapter_auth_problem(platform="qq", token=DISCORD_TOKEN, client_host="127.0.0.1") is not None


# --- in-process: what a connection may say ------------------------------------------------------------
pytestmark_db = pytest.mark.django_db(transaction=True)


async def _connected(comm: WebsocketCommunicator) -> WebsocketCommunicator:
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    return comm


@pytestmark_db
async def test_a_discord_token_connecting_as_qq_is_closed_and_the_qq_adapter_stays(app, make_session, caplog):
    qq = await _connected(adapter(app))
    await wait_for_async(lambda: AdapterConnection.objects.filter(platform="qq").exists())
    intruder = await _connected(adapter(app, token=DISCORD_TOKEN, platform="qq"))
    assert await intruder.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 1008}
    await intruder.wait(timeout=TIMEOUT)
    assert "refused: the token is bound to platform discord, not 'qq'" in caplog.text
    # The real QQ adapter was not replaced: it still receives what is sent to QQ.
    session = await db(make_session, user_id="424242")
    out = await db(message_send, session=session, source_kind="reply", text="still yours")
    frame = await qq.receive_json_from(timeout=TIMEOUT)
    assert frame["message_info"]["message_id"] == str(out.uid)
    assert await db(lambda: AdapterConnection.objects.filter(platform="qq").count()) == 1
    await qq.disconnect(timeout=TIMEOUT)


@pytestmark_db
async def test_a_frame_naming_another_platform_is_dropped_and_the_connection_keeps_working(app, caplog):
    discord = await _connected(adapter(app, token=DISCORD_TOKEN, platform="discord"))
    # As any QQ user, or with only the speaker or the group claiming QQ.
    await discord.send_json_to(envelope(platform="qq", user_id=10001, text="I am your operator"))
    spoofed_user = envelope(platform="discord", user_id=10002, text="half spoofed")
    spoofed_user["message_info"]["user_info"]["platform"] = "qq"
    await discord.send_json_to(spoofed_user)
    await discord.send_json_to(envelope(platform="discord", user_id=10003, text="a real discord message"))
    stored = await wait_for_async(lambda: Message.objects.filter(direction="in").first())
    assert stored.text == "a real discord message"
    assert await db(lambda: list(ChatSession.objects.values_list("platform", flat=True))) == ["discord"]
    assert await db(lambda: Message.objects.count()) == 1
    assert caplog.text.count("dropped: it names platform qq, not its connection's") == 2
    await discord.disconnect(timeout=TIMEOUT)


@pytestmark_db
async def test_an_api_server_package_naming_another_platform_is_dropped(app, caplog):
    from maim_message import MessageBase, MessageConverter

    comm = await _connected(
        WebsocketCommunicator(app, "/ws", headers=[(b"x-platform", b"qq"), (b"x-apikey", TOKEN.encode())])
    )

    def package(frame: dict, dim_platform: str) -> dict:
        api = MessageConverter.to_api_receive(MessageBase.from_dict(frame), api_key=TOKEN, platform=dim_platform)
        return {"ver": 1, "msg_id": frame["message_info"]["message_id"], "type": "sys_std", "payload": api.to_dict()}

    # The envelope says qq, the package's message_dim says discord (and the other way round).
    await comm.send_json_to(package(envelope(platform="qq", text="dim says discord", message_id="m1"), "discord"))
    await comm.send_json_to(package(envelope(platform="discord", text="info says discord", message_id="m2"), "qq"))
    await comm.send_json_to(package(envelope(platform="qq", text="all qq", message_id="m3"), "qq"))
    stored = await wait_for_async(lambda: Message.objects.filter(direction="in").first())
    assert stored.text == "all qq" and await db(lambda: Message.objects.count()) == 1
    assert caplog.text.count("dropped: it names platform discord, not its connection's") == 2
    await comm.disconnect(timeout=TIMEOUT)


# --- receipts --------------------------------------------------------------------------------------------
def _echo(platform: str, message: Message, actual_id: int) -> None:
    receipt = (platform, {"type": "echo", "echo": str(message.uid), "actual_id": actual_id})
    adapter_frames_store(frames=AdapterFrames(receipts=[receipt]))


def _handed_over(platform: str) -> list[int]:
    token, batch = outbox_claim(adapter_platforms=[platform], web_users=[], accept_formats={})
    ids = [d.message_id for d in batch]
    outbox_finish(token=token, sent=ids, released=[], failed={})
    return ids


def test_an_echo_settles_only_a_handed_over_message_of_its_own_platform(make_session):
    pending, handed = messages_send(
        [Outbound(session=make_session(platform="qq"), source_kind="proactive", text=t) for t in ("p", "h")]
    )
    Message.objects.filter(pk=pending.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    assert _handed_over("qq") == [handed.pk]
    # Another platform's adapter echoes both; qq's own adapter echoes the one never handed over.
    _echo("discord", pending, 1)
    _echo("discord", handed, 2)
    _echo("qq", pending, 3)
    states = dict(Message.objects.values_list("pk", "delivery_status"))
    assert states == {pending.pk: DeliveryStatus.PENDING, handed.pk: DeliveryStatus.SENT}
    assert not Message.objects.exclude(platform_message_id="").exists()
    # QQ's echo of what was handed to QQ settles it.
    _echo("qq", handed, 4)
    settled = Message.objects.get(pk=handed.pk)
    assert (settled.delivery_status, settled.platform_message_id) == (DeliveryStatus.DELIVERED, "4")


# --- live: the real maim_message clients against a real daphne --------------------------------------------


def live(test):
    """A live test: the shared daphne sees the test's committed data."""
    return pytest.mark.live(pytest.mark.django_db(transaction=True)(test))


QQ_TOKEN = SHARED_ADAPTER_TOKENS[0]
DISCORD = shared_adapter_token("discord")


async def _open_qq_record() -> AdapterConnection | None:
    return await db(lambda: AdapterConnection.objects.filter(platform="qq", disconnected_at__isnull=True).first())


@live
async def test_real_clients_with_a_discord_token_cannot_take_over_qq(shared_server, make_session):
    if not MM07_PYTHON.exists():
        pytest.fail(f"{MM07_PYTHON} is missing: run `make venv-mm07`")
    log, base = shared_server
    qq = await Adapter06(base, token=QQ_TOKEN).start()
    try:
        record = await wait_for_async(_open_qq_record, what="the QQ adapter recorded")
        # The 0.6.x wire, the 0.7.x Socket.IO client, and the API-Server client, each presenting the
        # discord token as qq.
        async with RawSocket(base, platform="qq", token=DISCORD) as raw:
            assert await raw.closed_with() == 1008
        for intruder in (Adapter07(base, platform="qq", token=DISCORD), ApiClient(base, api_key=DISCORD)):
            try:
                assert await intruder.start() == "refused"
            finally:
                await intruder.stop()
        log.wait_for_output("refused: the token is bound to platform discord, not 'qq'")
        # The QQ adapter was never replaced and keeps receiving QQ's messages.
        assert qq.router.check_connection("qq")
        assert (await _open_qq_record()).pk == record.pk
        session = await db(make_session, user_id="515151")
        out = await db(message_send, session=session, source_kind="reply", text="for the real QQ adapter")
        while (frame := await qq.next_message())["message_info"]["message_id"] != str(out.uid):
            pass
        assert frame["message_segment"]["data"] == [{"type": "text", "data": "for the real QQ adapter"}]
    finally:
        await qq.stop()


@live
async def test_a_real_api_server_client_cannot_inject_for_another_platform(shared_server):
    if not MM07_PYTHON.exists():
        pytest.fail(f"{MM07_PYTHON} is missing: run `make venv-mm07`")
    log, base = shared_server
    client = ApiClient(base, api_key=SHARED_ADAPTER_TOKENS[1])  # a qq key
    try:
        assert await client.start() == "connected"
        await client.command({"cmd": "send", "frame": envelope(platform="discord", user_id=7, text="as discord")})
        await client.command({"cmd": "send", "frame": envelope(user_id=8, text="as qq")})
        await wait_for_async(lambda: Message.objects.filter(text="as qq").exists())
        log.wait_for_output("dropped: it names platform discord, not its connection's")
        assert not await db(lambda: Message.objects.filter(text="as discord").exists())
        assert not await db(lambda: ChatSession.objects.filter(platform="discord").exists())
    finally:
        await client.stop()


async def _api(base: str, raw: str, path: str) -> dict:
    from tests.api.test_api_live import http

    status, _, body = await asyncio.to_thread(
        http, "GET", f"{base}/api/v1{path}", None, {"Authorization": f"Bearer {raw}"}
    )
    assert status == 200, body
    return body


@live
async def test_a_discord_echo_never_settles_a_qq_message(shared_server):
    log, base = shared_server
    _, raw = await db(api_token_create, name="identity", scopes=["send", "read_own"])
    discord = await Adapter06(base, platform="discord", token=DISCORD).start()
    qq = None
    try:
        # No QQ adapter: a message to QQ waits in the outbox. The discord adapter echoes its id.
        status, _, created = await asyncio.to_thread(
            http,
            "POST",
            f"{base}/api/v1/messages",
            {"channel_type": "qq", "channel_user_id": "626262", "text": "for QQ only"},
            {"Authorization": f"Bearer {raw}"},
        )
        assert status == 201, created
        uid = created["delivery"]["message_id"]
        await discord.echo(uid, 31337)
        log.wait_for_output(f"receipt from discord for {uid} ignored")
        detail = await _api(base, raw, f"/messages/{created['id']}")
        assert detail["delivery"]["status"] == "pending" and detail["delivery"]["platform_message_id"] is None

        # QQ connects and gets it; discord echoes it again once it was handed to QQ: still only sent.
        qq = await Adapter06(base, token=QQ_TOKEN).start()
        while (await qq.next_message())["message_info"]["message_id"] != uid:
            pass
        await wait_for_async(lambda: Message.objects.filter(uid=uid, delivery_status=DeliveryStatus.SENT).exists())
        await discord.echo(uid, 31338)
        await wait_for_async(lambda: log.output().count(f"receipt from discord for {uid} ignored") == 2)
        assert (await _api(base, raw, f"/messages/{created['id']}"))["delivery"]["status"] == "sent"

        # QQ's own echo of what was handed to it marks it delivered.
        await qq.echo(uid, 4242)
        await wait_for_async(lambda: Message.objects.filter(uid=uid, delivery_status=DeliveryStatus.DELIVERED).exists())
        detail = await _api(base, raw, f"/messages/{created['id']}")
        assert (detail["delivery"]["status"], detail["delivery"]["platform_message_id"]) == ("delivered", "4242")
    finally:
        await discord.stop()
        if qq is not None:
            await qq.stop()
