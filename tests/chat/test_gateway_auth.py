"""Who may connect as an adapter (tokens, API-Server keys, MAIBOT_ADAPTER_ALLOW_FROM), the refusal log's
throttle, and maim_message's API-Server packages both ways, checked against the real library's classes
(maim_message 0.6.8 in this environment has the same APIMessageBase and MessageConverter as 0.7.5). The
fast tier: in-process. The real 0.7.5 and 0.6.8 clients against a live daphne: test_gateway_apiserver.py."""

from __future__ import annotations

import hmac
import ipaddress
import logging

import pytest
from channels.testing import WebsocketCommunicator
from django.core.exceptions import ImproperlyConfigured
from maim_message import MessageBase, MessageConverter
from maim_message.message import APIMessageBase

from chat.gateway import auth
from chat.gateway.auth import RefusalLog, adapter_auth_problem, adapter_hello, environ_headers
from chat.models import AdapterConnection, ChatSession, DeliveryStatus, Message
from chat.services import message_send, session_get_or_create
from chat.wire.inbound import CustomMessage, EnvelopeError, InboundMessage, parse_api_package, parse_envelope
from chat.wire.outbound import api_server_ack, api_server_package
from core.adapter_tokens import parse_adapter_tokens
from core.networks import MAX_NETWORKS, address_in, parse_networks
from tests.chat.gateway_helpers import TIMEOUT, TOKEN, envelope
from tests.conftest import db, wait_for_async

NAME = "MAIBOT_ADAPTER_ALLOW_FROM"


# --- the rules ---------------------------------------------------------------------------------------
@pytest.fixture
def tokens(settings):
    settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens("qq:key-one,key-two,discord:key-dc", name="T")
    settings.MAIBOT_ADAPTER_ALLOW_FROM = parse_networks("10.0.0.0/8, fd00::/8", name=NAME)
    return settings


@pytest.mark.parametrize("api_server", [False, True])
def test_with_tokens_the_right_token_is_admitted_from_anywhere_and_a_wrong_one_from_nowhere(tokens, api_server):
    check = dict(platform="qq", api_server=api_server)
    assert adapter_auth_problem(token="key-two", client_host="203.0.113.9", **check) is None
    assert adapter_auth_problem(token="Bearer key-one", client_host="203.0.113.9", **check) is None
    assert adapter_auth_problem(token="key-three", client_host="203.0.113.9", **check) == "invalid token"
    # A wrong token is refused even from an allowed network or loopback.
    assert adapter_auth_problem(token="key-three", client_host="10.1.2.3", **check) == "invalid token"
    assert adapter_auth_problem(token="key-three", client_host="127.0.0.1", **check) == "invalid token"


def test_with_tokens_no_token_is_admitted_only_from_an_allowed_network_for_a_platform_without_one(tokens):
    for host in ("10.1.2.3", "::ffff:10.9.9.9", "fd00::1", "[fd00::2]"):
        assert adapter_auth_problem(platform="telegram", token=None, client_host=host) is None, host
        assert adapter_auth_problem(platform="telegram", token="  ", client_host=host) is None, host
        # qq and discord have tokens: an allowed address does not stand in for them.
        for platform in ("qq", "discord"):
            problem = adapter_auth_problem(platform=platform, token=None, client_host=host)
            assert (
                problem
                == f"missing token (platform {platform!r} has one in MAIBOT_ADAPTER_TOKENS: its adapter must send it)"
            )
    for host in ("127.0.0.1", "192.168.1.20", "fe80::1", "", None, "not-an-address"):
        problem = adapter_auth_problem(platform="telegram", token=None, client_host=host)
        assert problem is not None and "MAIBOT_ADAPTER_ALLOW_FROM" in problem, host


def test_without_tokens_loopback_and_the_allowed_networks_are_admitted(settings):
    settings.MAIBOT_ADAPTER_TOKENS = ()
    settings.MAIBOT_ADAPTER_ALLOW_FROM = parse_networks("192.168.1.0/24", name=NAME)
    for host in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "192.168.1.77"):
        assert adapter_auth_problem(platform="qq", token=None, client_host=host) is None, host
    assert "loopback" in adapter_auth_problem(platform="qq", token=None, client_host="192.168.2.1")


def test_the_platform_is_required_and_web_is_reserved(tokens):
    assert adapter_auth_problem(platform="", token="key-one", client_host="1.2.3.4") == "missing `platform` header"
    missing = adapter_auth_problem(platform="", token="key-one", client_host="1.2.3.4", api_server=True)
    assert missing == "missing `x-platform` header"
    assert "reserved" in adapter_auth_problem(platform="web", token="key-one", client_host="1.2.3.4", api_server=True)


def test_every_configured_token_is_compared_in_constant_time(tokens, monkeypatch):
    calls = []
    real = hmac.compare_digest

    def compare(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", compare)
    assert adapter_auth_problem(platform="qq", token="key-one", client_host="1.2.3.4") is None
    # The first token matched; the others were compared all the same.
    assert calls == [(b"key-one", b"key-one"), (b"key-one", b"key-two"), (b"key-one", b"key-dc")]


def test_the_mode_is_read_from_the_headers():
    legacy = adapter_hello({"platform": " qq ", "authorization": "tok"})
    assert (legacy.platform, legacy.token, legacy.api_server) == ("qq", "tok", False)
    api = adapter_hello({"x-platform": "qq", "x-apikey": "key", "x-uuid": "u1"})
    assert (api.platform, api.token, api.api_server) == ("qq", "key", True)
    # An x-apikey without x-platform is an API-Server client that forgot its platform, not a legacy one.
    assert adapter_hello({"x-apikey": "key", "platform": "qq"}).platform == ""
    environ = {"HTTP_X_APIKEY": "key", "HTTP_X_PLATFORM": "qq", "HTTP_X_UUID": "u", "REMOTE_ADDR": "1.2.3.4"}
    assert environ_headers(environ) == {"x-apikey": "key", "x-platform": "qq", "x-uuid": "u"}


# --- MAIBOT_ADAPTER_ALLOW_FROM -------------------------------------------------------------------------
def test_allow_from_parses_cidrs_and_bare_addresses():
    networks = parse_networks(" 10.0.0.0/8 , 192.168.1.7,fd00::/8,, ", name=NAME)
    assert networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("192.168.1.7/32"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert parse_networks("", name=NAME) == ()
    assert address_in("192.168.1.7", networks) and not address_in("192.168.1.8", networks)


@pytest.mark.parametrize(
    "value, named",
    [
        ("10.0.0.0/8,192.168.1.7/24", "'192.168.1.7/24'"),  # host bits set: the address or the network?
        ("10.0.0.0/33", "'10.0.0.0/33'"),
        ("localhost", "'localhost'"),
        ("10.0.0.0/8;10.1.0.0/16", "'10.0.0.0/8;10.1.0.0/16'"),
    ],
)
def test_a_bad_allow_from_entry_is_a_clear_error_naming_it(value, named):
    with pytest.raises(ImproperlyConfigured) as refused:
        parse_networks(value, name=NAME)
    assert str(refused.value).startswith(f"{NAME}: {named} is not a network in CIDR notation")


def test_allow_from_is_bounded():
    many = ",".join(f"10.0.{i // 256}.{i % 256}" for i in range(MAX_NETWORKS + 1))
    with pytest.raises(ImproperlyConfigured, match=f"at most {MAX_NETWORKS} networks"):
        parse_networks(many, name=NAME)


# --- the refusal log -------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "chat.gateway.auth"]


def test_a_refusal_is_logged_once_per_address_and_reason_per_minute(caplog):
    clock = Clock()
    log = RefusalLog(clock=clock)
    caplog.set_level(logging.WARNING, logger="chat.gateway.auth")
    for _ in range(30):  # the NapCat adapter's legacy mode: 30 retries in 30 s
        log.refused(address="10.0.0.5", reason="invalid token", platform="qq", mode="Socket.IO")
        clock.now += 1
    log.refused(address="10.0.0.6", reason="invalid token", platform="qq", mode="Socket.IO")
    log.refused(address="10.0.0.5", reason="missing `platform` header", platform="", mode="websocket")
    assert _refusals(caplog) == [
        "Socket.IO adapter connection from 10.0.0.5 (platform 'qq') refused: invalid token",
        "Socket.IO adapter connection from 10.0.0.6 (platform 'qq') refused: invalid token",
        "websocket adapter connection from 10.0.0.5 (platform '') refused: missing `platform` header",
    ]
    caplog.clear()
    clock.now += 29.9  # 59.9 s after the first line
    assert not log.refused(address="10.0.0.5", reason="invalid token", platform="qq", mode="Socket.IO")
    clock.now += 0.1
    assert log.refused(address="10.0.0.5", reason="invalid token", platform="qq", mode="Socket.IO")
    assert _refusals(caplog) == [
        "Socket.IO adapter connection from 10.0.0.5 (platform 'qq') refused: invalid token "
        "(30 more since the last such line)"
    ]


def test_the_refusal_log_remembers_a_bounded_number_of_pairs(caplog):
    clock = Clock()
    log = RefusalLog(clock=clock, max_keys=3)
    caplog.set_level(logging.WARNING, logger="chat.gateway.auth")
    for host in ("a", "b", "c"):
        log.refused(address=host, reason="r", platform="qq", mode="websocket")
    log.refused(address="a", reason="r", platform="qq", mode="websocket")  # a is the most recent now
    log.refused(address="d", reason="r", platform="qq", mode="websocket")  # b, the least recent, is forgotten
    assert len(log) == 3
    assert not log.refused(address="a", reason="r", platform="qq", mode="websocket")
    assert log.refused(address="b", reason="r", platform="qq", mode="websocket")  # forgotten: logged again
    assert len(_refusals(caplog)) == 5


# --- API-Server packages, inbound ---------------------------------------------------------------------
def _client_package(api_message: APIMessageBase) -> dict:
    """A package exactly as maim_message's WebSocketClient.send_message builds it."""
    return {
        "ver": 1,
        "msg_id": "msg_0123456789ab_1795306251",
        "type": "sys_std",
        "meta": {"sender_user": "key-one", "platform": "qq", "timestamp": 1795306251.3},
        "payload": api_message.to_dict(),
    }


def test_an_api_server_group_message_is_parsed_as_its_legacy_envelope():
    legacy = envelope(user_id=7, nickname="Bob", group_id=888, group_name="群", text="hi 你好", message_id=99)
    api = MessageConverter.to_api_receive(MessageBase.from_dict(legacy), api_key="key-one", platform="qq")
    parsed = parse_api_package(_client_package(api))
    assert isinstance(parsed, InboundMessage)
    expected = parse_envelope(legacy)
    assert parsed.is_group
    assert parsed.info.group_info == expected.info.group_info
    assert parsed.info.user_info == expected.info.user_info
    assert parsed.info.message_id == "99"
    assert parsed.segments == expected.segments == [{"type": "text", "data": "hi 你好"}]
    assert parsed.info.format_info.accept_format == expected.info.format_info.accept_format


def test_an_api_server_private_message_needs_its_sender():
    api = MessageConverter.to_api_receive(MessageBase.from_dict(envelope(user_id=5)), api_key="k", platform="qq")
    parsed = parse_api_package(_client_package(api))
    assert (parsed.is_group, parsed.info.user_info.user_id) == (False, "5")
    package = _client_package(api)
    del package["payload"]["message_info"]["sender_info"]
    with pytest.raises(EnvelopeError, match=r"a private message needs user_info\.user_id"):
        parse_api_package(package)


def test_api_server_custom_messages_are_read_as_legacy_ones_and_acks_carry_nothing():
    echo = {
        "ver": 1,
        "msg_id": "custom_0123456789ab_1795306251",
        "type": "custom_message_id_echo",
        "meta": {"sender_user": "key-one", "platform": "qq", "timestamp": 1.0},
        "payload": {"type": "echo", "echo": "uid-1", "actual_id": 987},
    }
    parsed = parse_api_package(echo)
    assert isinstance(parsed, CustomMessage)
    assert (parsed.platform, parsed.message_type_name, parsed.content) == ("qq", "message_id_echo", echo["payload"])
    ack = {"ver": 1, "msg_id": "x", "type": "sys_ack", "meta": {"acked_msg_id": "msg_1"}, "payload": {}}
    assert parse_api_package(ack) is None


@pytest.mark.parametrize(
    "frame, problem",
    [
        ({"ver": 1, "payload": {}}, "type: Field required"),
        ({"type": "sys_std", "payload": "text"}, "payload: an APIMessageBase is an object"),
        ({"type": "sys_std", "payload": {"message_segment": {}}}, "payload.message_info: Field required"),
        ({"type": "something_else", "payload": {}}, "unknown API-Server package type"),
        ({"type": "custom_", "payload": {}}, "unknown API-Server package type"),
        ({"type": "custom_x", "payload": "bad \x00 text"}, "content:"),
    ],
)
def test_a_bad_api_server_package_is_refused_naming_the_problem(frame, problem):
    with pytest.raises(EnvelopeError, match=problem.replace("(", r"\(")):
        parse_api_package(frame)


# --- API-Server packages, outbound ----------------------------------------------------------------------
def _as_the_adapter_reads_it(package: dict) -> dict:
    """What MaiBot-Napcat-Adapter's API-Server bridge hands its send handler: the client parses the payload
    with APIMessageBase.from_dict, the bridge converts it with MessageConverter.from_api_send."""
    assert package["type"] == "sys_std" and package["msg_id"]
    return MessageConverter.from_api_send(APIMessageBase.from_dict(package["payload"])).to_dict()


def test_a_group_envelope_reaches_the_adapter_as_the_legacy_one():
    legacy = {
        "message_info": {
            "platform": "qq",
            "message_id": "4f1c",
            "time": 1795306251.307,
            "group_info": {"platform": "qq", "group_id": 888, "group_name": "群"},
            "user_info": {"platform": "qq", "user_id": 123456, "user_nickname": "麦麦", "user_cardname": ""},
            "additional_config": {},
        },
        "message_segment": {
            "type": "seglist",
            "data": [{"type": "reply", "data": "42"}, {"type": "text", "data": "hi"}],
        },
        "raw_message": "hi",
    }
    package = api_server_package(legacy, platform="qq")
    info = package["payload"]["message_info"]
    assert "group_info" not in info and "user_info" not in info
    assert package["payload"]["message_dim"] == {"api_key": "", "platform": "qq"}
    read = _as_the_adapter_reads_it(package)
    for key in ("platform", "message_id", "time", "group_info", "user_info", "additional_config"):
        assert read["message_info"][key] == legacy["message_info"][key], key
    assert read["message_segment"] == legacy["message_segment"]


def test_a_private_envelope_and_a_command_reach_the_adapter_as_the_legacy_ones():
    legacy = {
        "message_info": {
            "platform": "qq",
            "message_id": "9a",
            "time": 1.5,
            "user_info": {"platform": "qq", "user_id": 10001, "user_nickname": "Alice", "user_cardname": ""},
            "additional_config": {},
        },
        "message_segment": {"type": "command", "data": {"name": "GROUP_BAN", "args": {"qq_id": 1, "duration": 60}}},
        "raw_message": "",
    }
    read = _as_the_adapter_reads_it(api_server_package(legacy, platform="qq"))
    assert read["message_info"]["user_info"] == legacy["message_info"]["user_info"]
    assert read["message_info"].get("group_info") is None
    assert read["message_segment"] == legacy["message_segment"]


def test_the_ack_names_the_frame_it_acknowledges():
    ack = api_server_ack("msg_abc", connection_uuid="single_1")
    assert ack["type"] == "sys_ack" and ack["ver"] == 1 and ack["msg_id"] != "msg_abc"
    assert (ack["meta"]["acked_msg_id"], ack["meta"]["uuid"]) == ("msg_abc", "single_1")


# --- in-process: an API-Server client over the plain websocket (maim_message 0.6.x's transport) ----------
def _api_adapter(application, *, key: str | None = TOKEN, host: str = "127.0.0.1") -> WebsocketCommunicator:
    headers = [(b"x-platform", b"qq"), (b"x-uuid", b"single_test")]
    if key is not None:
        headers.append((b"x-apikey", key.encode()))
    comm = WebsocketCommunicator(application, "/ws", headers=headers)
    comm.scope["client"] = (host, 50000)
    return comm


pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
async def test_an_api_server_connection_is_served_acked_and_confirmed(app):
    session = await db(session_get_or_create, platform="qq", chat_type="private", user_id="10001", user_nickname="A")
    comm = _api_adapter(app)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    try:
        await wait_for_async(lambda: AdapterConnection.objects.filter(disconnected_at__isnull=True).exists())
        api = MessageConverter.to_api_receive(
            MessageBase.from_dict(envelope(user_id=10001, text="over the API", message_id=555)), api_key=TOKEN
        )
        await comm.send_json_to(_client_package(api))
        # The ack comes on receipt, before anything else.
        ack = await comm.receive_json_from(timeout=TIMEOUT)
        assert ack["type"] == "sys_ack"
        assert (ack["meta"]["uuid"], ack["meta"]["acked_msg_id"]) == ("single_test", "msg_0123456789ab_1795306251")
        # Resent (the client's cache resends what it holds unacknowledged): acknowledged, not stored again.
        await comm.send_json_to(_client_package(api))
        again = await comm.receive_json_from(timeout=TIMEOUT)
        assert (again["type"], again["meta"]["acked_msg_id"]) == ("sys_ack", "msg_0123456789ab_1795306251")
        stored = await wait_for_async(lambda: Message.objects.filter(platform_message_id="555").first())
        assert (stored.text, stored.session_id) == ("over the API", session.pk)

        out = await db(message_send, session=session, source_kind="reply", text="back over the API")
        # The offline planner answers the message too; ours is the one with our id.
        while True:
            package = await comm.receive_json_from(timeout=TIMEOUT)
            read = _as_the_adapter_reads_it(package)
            if read["message_info"]["message_id"] == str(out.uid):
                break
        assert read["message_info"]["user_info"]["user_id"] == 10001
        assert read["message_segment"]["data"] == [{"type": "text", "data": "back over the API"}]
        # The client acknowledges what we sent; nothing comes of it (and it is not acknowledged back).
        await comm.send_json_to(api_server_ack(package["msg_id"]))
        echo = {
            "ver": 1,
            "msg_id": "custom_echo_1",
            "type": "custom_message_id_echo",
            "meta": {"sender_user": TOKEN, "platform": "qq", "timestamp": 1.0},
            "payload": {"type": "echo", "echo": str(out.uid), "actual_id": 4242},
        }
        await comm.send_json_to(echo)
        while (frame := await comm.receive_json_from(timeout=TIMEOUT))["type"] != "sys_ack":
            pass
        assert frame["meta"]["acked_msg_id"] == "custom_echo_1"  # the first ack since: not one for the client's ack
        delivered = await wait_for_async(
            lambda: Message.objects.filter(pk=out.pk, delivery_status=DeliveryStatus.DELIVERED).first()
        )
        assert delivered.platform_message_id == "4242"
        assert await db(lambda: Message.objects.filter(direction="in").count()) == 1
    finally:
        await comm.disconnect(timeout=TIMEOUT)
    record = await db(lambda: AdapterConnection.objects.get())
    assert record.protocol == "ws" and "reply" in record.accept_format


@pytestmark_db
@pytest.mark.parametrize("key", ["wrong-key", None])
async def test_an_api_server_connection_with_a_wrong_or_no_key_is_closed_and_nothing_is_stored(app, key):
    comm = _api_adapter(app, key=key, host="192.0.2.10")
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected  # as the reference servers: accept, then close
    assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 1008}
    await comm.wait(timeout=TIMEOUT)
    assert not await db(lambda: AdapterConnection.objects.exists())
    assert not await db(lambda: ChatSession.objects.exists())
    assert not await db(lambda: Message.objects.exists())


@pytestmark_db
async def test_a_legacy_adapter_without_a_token_is_admitted_from_an_allowed_network(app, settings):
    # For a platform without a token (the app fixture has tokens for qq and discord).
    settings.MAIBOT_ADAPTER_ALLOW_FROM = parse_networks("192.0.2.0/24", name=NAME)
    for host, admitted in (("192.0.2.10", True), ("198.51.100.1", False)):
        comm = WebsocketCommunicator(app, "/ws", headers=[(b"platform", b"telegram")])
        comm.scope["client"] = (host, 40000)
        connected, _ = await comm.connect(timeout=TIMEOUT)
        assert connected
        if admitted:
            await comm.send_json_to(envelope(platform="telegram", text=f"from {host}"))
            await wait_for_async(lambda h=host: Message.objects.filter(text=f"from {h}").exists())
            await comm.disconnect(timeout=TIMEOUT)
        else:
            assert await comm.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 1008}
            await comm.wait(timeout=TIMEOUT)
    assert await db(lambda: AdapterConnection.objects.count()) == 1
