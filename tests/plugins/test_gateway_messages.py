"""MessageDict (what adapter plugins' gateways speak, in the shapes the official NapCat adapter plugin sends
and reads) against our envelope, both ways, and a gateway's answer read as a row's fate."""

from __future__ import annotations

import base64
import hashlib

import pytest
from pydantic import ValidationError

from chat.outbox_rows import Answered
from chat.wire.inbound import parse_envelope
from plugins.gateway_messages import MessageDict, inbound_envelope, outbound_message
from plugins.gateways import answer_of

BOT = "3000000001"
AT_NAMES = {"target_user_nickname": "小麦", "target_user_cardname": "麦"}


def napcat_group_message(**overrides) -> dict:
    """A group @-mention as the NapCat plugin routes it (codecs/inbound/message_codec.py)."""
    message = {
        "message_id": "1800000123",
        "timestamp": "1795306251.0",
        "platform": "qq",
        "message_info": {
            "user_info": {"user_id": "10002", "user_nickname": "Bob", "user_cardname": None},
            "group_info": {"group_id": "555", "group_name": "测试群"},
            "additional_config": {"self_id": BOT, "napcat_message_type": "group", "platform_io_target_group_id": "555"},
        },
        "raw_message": [
            {"type": "reply", "data": {"target_message_id": "1800000100", "target_message_sender_id": BOT}},
            {"type": "at", "data": {"target_user_id": BOT, **AT_NAMES}},
            {"type": "text", "data": " 看图"},
            {"type": "image", "data": "", "hash": "x", "binary_data_base64": base64.b64encode(b"\x89PNG").decode()},
            {"type": "voice", "data": ""},
        ],
        "is_mentioned": True,
        "is_at": True,
        "processed_plain_text": "[reply]@麦 看图[image][voice]",
        "display_message": "[reply]@麦 看图[image][voice]",
    }
    message.update(overrides)
    return message


def test_a_routed_group_mention_becomes_the_envelope_a_maim_message_adapter_sends():
    routed = MessageDict.model_validate(napcat_group_message())
    envelope = inbound_envelope(routed, platform="qq", account=BOT, route_metadata={"self_id": BOT})
    parsed = parse_envelope(envelope)
    info = parsed.info
    assert (info.platform, info.message_id, info.time) == ("qq", "1800000123", 1795306251.0)
    assert (info.user_info.user_id, info.user_info.user_nickname) == ("10002", "Bob")
    assert (info.group_info.group_id, info.group_info.group_name) == ("555", "测试群")
    assert info.receiver_info.user_info.user_id == BOT  # the bot's account, as receiver_info names it
    assert info.additional_config["reply_message_id"] == "1800000100"
    assert parsed.segments == [
        {"type": "text", "data": f"@<麦:{BOT}>"},
        {"type": "text", "data": " 看图"},
        {"type": "image", "data": base64.b64encode(b"\x89PNG").decode()},
        {"type": "text", "data": "[voice]"},  # no bytes came with it
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"message_id": ""}, "message_id"),
        ({"message_info": {"user_info": {"user_nickname": "no id"}}}, "message_info.user_info.user_id"),
        ({"raw_message": "ping"}, "raw_message"),
        ({"raw_message": [{"type": "text", "data": "x"}] * 501}, "raw_message"),
        ({"message_id": "9" * 129}, "message_id"),
    ],
)
def test_a_forged_message_dict_is_refused_naming_the_field(change, field):
    with pytest.raises(ValidationError) as exc:
        MessageDict.model_validate(napcat_group_message(**change))
    assert field in str(exc.value).replace("\n", ".").replace(" ", "")


def test_an_outbound_private_reply_is_the_message_dict_the_napcat_plugin_sends_from():
    frame = {
        "message_info": {
            "platform": "qq",
            "message_id": "74543e5c-0ff8-4e3f-beea-f27b16edb439",
            "time": 1795306251.307,
            "user_info": {"platform": "qq", "user_id": 10001, "user_nickname": "Alice", "user_cardname": ""},
            "additional_config": {},
        },
        "message_segment": {
            "type": "seglist",
            "data": [
                {"type": "reply", "data": "1800000123"},
                {"type": "text", "data": "pong"},
                {"type": "image", "data": base64.b64encode(b"img").decode()},
            ],
        },
        "raw_message": "pong[image]",
    }
    message = outbound_message(frame, account=BOT, scope="")
    assert message["message_id"] == "74543e5c-0ff8-4e3f-beea-f27b16edb439"
    assert message["message_info"]["group_info"] is None
    assert message["message_info"]["additional_config"]["platform_io_target_user_id"] == "10001"
    assert message["message_info"]["additional_config"]["self_id"] == BOT
    assert message["raw_message"] == [
        {"type": "reply", "data": {"target_message_id": "1800000123"}},
        {"type": "text", "data": "pong"},
        {
            "type": "image",
            "data": "",
            "hash": hashlib.sha256(b"img").hexdigest(),
            "binary_data_base64": base64.b64encode(b"img").decode(),
        },
    ]


def test_an_outbound_group_message_names_the_group_as_its_target():
    frame = {
        "message_info": {
            "platform": "qq",
            "message_id": "u1",
            "time": 1.0,
            "group_info": {"platform": "qq", "group_id": 555, "group_name": "测试群"},
            "user_info": {"platform": "qq", "user_id": int(BOT), "user_nickname": "小麦", "user_cardname": ""},
        },
        "message_segment": {"type": "seglist", "data": [{"type": "text", "data": "在的"}]},
    }
    message = outbound_message(frame, account=BOT, scope="")
    assert message["message_info"]["group_info"] == {"group_id": "555", "group_name": "测试群"}
    assert message["message_info"]["additional_config"]["platform_io_target_group_id"] == "555"


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        (
            {"success": True, "external_message_id": "1800000124", "metadata": {"adapter_callbacks": []}},
            Answered(True, platform_id="1800000124"),
        ),
        ({"success": False, "error": "NapCat is not connected"}, Answered(False, reason="NapCat is not connected")),
        (
            {"success": False, "error": "消息发送失败", "metadata": {"retcode": 1200}},
            Answered(False, reason="消息发送失败"),
        ),
        ({"success": True, "external_message_id": None}, Answered(True)),
        ("1800000125", Answered(True, platform_id="1800000125")),
        (None, Answered(True)),
    ],
)
def test_a_gateway_answer_is_read_as_maibot_reads_it(result, answer):
    assert answer_of(result) == answer
