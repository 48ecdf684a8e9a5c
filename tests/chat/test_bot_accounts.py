"""The bot's own account on each platform (bot.platform_accounts, else what the adapter told): group
messages go out as that account, and `@<any name:that id>` is a mention."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from maim_message import MessageBase

from chat.accounts import bot_account
from chat.ingest import AdapterFrames, InboundItem, adapter_frames_store
from chat.models import AdapterPlatform, Direction, Message
from chat.planner import mentions_bot
from chat.planner.observe import observe
from chat.services import message_send
from chat.wire.inbound import parse_envelope
from chat.wire.outbound import adapter_envelope
from core import config
from tests.chat.gateway_helpers import envelope

pytestmark = pytest.mark.django_db


def test_an_at_mention_of_the_bots_account_counts_whatever_the_nickname():
    cfg = config.get_config()
    said = lambda text: Message(text=text)  # noqa: E731
    # The QQ nickname is nothing the config knows; the account id is what identifies the bot.
    assert mentions_bot(said("@<QQ昵称:123456> 在吗"), cfg, bot_account="123456")
    assert not mentions_bot(said("@<QQ昵称:123456> 在吗"), cfg)
    assert not mentions_bot(said("@<Alice:654321> lunch?"), cfg, bot_account="123456")
    assert not mentions_bot(said("123456 is a number, not a mention"), cfg, bot_account="123456")


def test_the_configured_account_wins_over_the_learned_one_and_observe_reports_it(make_session):
    group = make_session("group")
    Message.objects.create(
        session=group, direction=Direction.IN, source_kind="user", text="@<QQ昵称:42> hi", time=timezone.now()
    )
    AdapterPlatform.objects.create(platform="qq", bot_account="42")
    assert bot_account("qq") == "42"
    seen = observe(session_pk=group.pk, after_pk=0, platform="qq")
    assert seen.bot_account == "42" and mentions_bot(
        seen.messages[0], config.get_config(), bot_account=seen.bot_account
    )
    with config.override(bot={"platform_accounts": {"qq": "123456"}}):
        assert bot_account("qq") == "123456"
        assert bot_account("telegram") == ""


def test_group_envelope_names_the_group_and_the_bot_as_the_napcat_adapter_needs(make_session):
    group = make_session("group", group_id="555", group_name="g")
    with config.override(bot={"platform_accounts": {"qq": "123456"}}):
        out = message_send(session=group, source_kind="reply", text="hello group")
        frame, error = adapter_envelope(out, group, None)
    assert error is None
    info = frame["message_info"]
    assert info["group_info"] == {"platform": "qq", "group_id": 555, "group_name": "g"}
    assert info["user_info"] == {"platform": "qq", "user_id": 123456, "user_nickname": "麦麦", "user_cardname": ""}
    # What the adapter's send handler sees after maim_message parses it: both present → the group branch.
    parsed = MessageBase.from_dict(frame).message_info
    assert parsed.group_info is not None and parsed.user_info is not None
    assert parsed.group_info.group_id == 555

    # No account known at all: user_info is still there (the adapter only needs it present), naming the bot.
    frame, _ = adapter_envelope(out, group, None)
    assert frame["message_info"]["user_info"]["user_id"] == "" and frame["message_info"]["user_info"]["user_nickname"]
    assert MessageBase.from_dict(frame).message_info.user_info is not None


def test_an_adapter_that_names_the_receiver_teaches_the_bots_account_once():
    def item(text: str) -> InboundItem:
        frame = envelope(user_id=4242, text=text)
        frame["message_info"]["receiver_info"] = {"user_info": {"platform": "qq", "user_id": 3355}}
        return InboundItem(platform="qq", message=parse_envelope(frame))

    adapter_frames_store(frames=AdapterFrames(messages=[item("one")]))
    assert AdapterPlatform.objects.get(platform="qq").bot_account == "3355"
    assert bot_account("qq") == "3355"
    # Told again: nothing more is written (the per-process cache knows it).
    with CaptureQueriesContext(connection) as again:
        adapter_frames_store(frames=AdapterFrames(messages=[item("two")]))
    assert not [q for q in again.captured_queries if "chat_adapterplatform" in q["sql"]]
