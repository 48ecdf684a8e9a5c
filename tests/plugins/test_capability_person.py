"""person.* through the real maibot-plugin-sdk's PluginContext: MaiBot's person ids (md5 of
"<platform>_<user_id>"), the values MaiBot's Person has, read from the person's own messages; an
unknown person as MaiBot answers one; nothing but Person fields is readable, and a plugin that did not
declare person.* is refused."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

import pytest

from chat.models import Message
from core import config
from tests.chat.planner_helpers import inbound_store
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)

PERSON_CAPS = ["person.get_id", "person.get_value", "person.get_id_by_name"]


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def test_ids_are_maibots_and_values_come_from_the_persons_messages(make_session):
    alice_chat = make_session(user_id="10001", user_nickname="Alice")
    group_a, group_b = make_session(chat_type="group", group_id="777"), make_session(chat_type="group", group_id="888")
    first = inbound_store(session=alice_chat, text="早")
    Message.objects.filter(pk=first.pk).update(time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    inbound_store(session=group_a, text="hi", sender_id="10001", sender_nickname="Alice")
    Message.objects.filter(session=group_a).update(sender_cardname="群里的爱丽丝")
    last = inbound_store(session=group_b, text="晚", sender_id="10001", sender_nickname="爱丽丝")
    inbound_store(session=group_b, text="other", sender_id="20002", sender_nickname="Bob")
    _, ctx = plugin("test.core.people", PERSON_CAPS)

    alice = run(ctx.person.get_id("qq", "10001"))
    assert alice == md5("qq_10001")
    assert run(ctx.person.get_id("webui-qq", 10001)) == alice  # MaiBot's "prefix-platform"
    value = lambda field: run(ctx.person.get_value(alice, field))  # noqa: E731
    assert (value("platform"), value("user_id"), value("is_known")) == ("qq", "10001", True)
    assert value("nickname") == value("person_name") == "爱丽丝"  # the latest name they used
    assert value("know_times") == 3
    assert value("know_since") == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    assert value("last_know") == pytest.approx(Message.objects.get(pk=last.pk).time.timestamp())
    assert value("group_cardname_list") == [{"group_id": "777", "group_cardname": "群里的爱丽丝"}]
    assert value("memory_points") == [] and value("name_reason") is None

    assert run(ctx.person.get_id_by_name("Bob")) == md5("qq_20002")
    assert run(ctx.person.get_id_by_name("群里的爱丽丝")) == alice  # a card name finds them too
    assert run(ctx.person.get_id_by_name("nobody")) == ""


def test_a_person_written_after_the_first_lookup_is_found(make_session):
    _, ctx = plugin("test.core.people", PERSON_CAPS)
    assert run(ctx.person.get_value(md5("qq_30003"), "is_known")) is False
    inbound_store(session=make_session(user_id="30003", user_nickname="Carol"), text="hello")
    assert run(ctx.person.get_value(md5("qq_30003"), "nickname")) == "Carol"


def test_unknown_people_and_fields_answer_as_maibot_does(make_session):
    _, ctx = plugin("test.core.people", PERSON_CAPS)
    stranger = md5("qq_99999")
    assert run(ctx.person.get_value(stranger, "is_known")) is False
    assert run(ctx.person.get_value(stranger, "person_name")) == f"未知用户{stranger[:4]}"
    missing = run(ctx.person.get_value(stranger, "nickname"))
    assert missing["success"] is False and "is not known here" in missing["error"]
    for hostile in ("__class__", "load_from_database", "sync_to_database", "_lock", "user_id; DROP"):
        result = run(ctx.person.get_value(md5("qq_1"), hostile))
        assert result["success"] is False and "'Person' object has no attribute" in result["error"], hostile
    assert run(ctx.person.get_id("qq", ""))["error"] == "缺少必要参数 platform 或 user_id"
    assert run(ctx.person.get_id_by_name(""))["error"] == "缺少必要参数 person_name"


def test_the_bot_itself_is_known_by_its_nickname(make_session):
    _, ctx = plugin("test.core.people", PERSON_CAPS)
    inbound_store(session=make_session(user_id="1"), text="x")  # someone, so the lookup has read the chats
    with config.override(bot={"platform_accounts": {"qq": "424242"}}):
        bot = run(ctx.person.get_id("qq", "424242"))
        assert run(ctx.person.get_value(bot, "nickname")) == "麦麦"


def test_a_plugin_that_did_not_declare_person_is_refused(make_session):
    _, ctx = plugin("test.core.nosy", ["person.get_id"])
    assert run(ctx.person.get_id("qq", "1")) == md5("qq_1")
    with pytest.raises(RuntimeError, match=re.escape("person.get_value is not declared in plugin test.core.nosy")):
        run(ctx.person.get_value(md5("qq_1"), "nickname"))
