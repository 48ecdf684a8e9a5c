"""person.get_id / person.get_value / person.get_id_by_name: the people the bot has heard from, read from
our chats and messages (there is no person table: a person is a platform user who wrote to the bot).

Arguments and results are MaiBot 1.3's (src/plugin_runtime/capabilities/data.py over
src/person_info/person_info.py): a person id is MaiBot's md5 of "<platform>_<user_id>", so ids a plugin
computed or stored under MaiBot still name the same person; `get_value` answers the Person fields MaiBot
has (`nickname`, `person_name`, `is_known`, `know_times`, `know_since`, `last_know`,
`group_cardname_list`, …) from the person's own messages: their latest nickname, how many messages
they sent, the first and the last one's Unix time, their card name in each group. `person_name` is the
nickname (we do not name people), `memory_points` is empty, `name_reason` null. A person we never
heard from is MaiBot's unknown person: `is_known` false, `person_name` "未知用户<id[:4]>", other fields
an error. Which person an id names is kept in this process (an id → (platform, user_id) map, extended
from the messages stored since it was last read, so a lookup reads only new rows).
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

from plugins.capabilities.common import MAX_ID, db

if TYPE_CHECKING:
    from plugins.records import PluginRecord

FIELDS = (
    "person_id", "platform", "user_id", "nickname", "person_name", "name_reason", "is_known", "know_times",
    "know_since", "last_know", "memory_points", "group_cardname_list",
)  # fmt: skip
MAX_GROUPS = 50  # group card names one answer carries
BATCH = 20_000  # messages read per query when learning who wrote

_lock = threading.Lock()
_people: dict[str, tuple[str, str]] = {}  # person id → (platform, user id)
_seen_pk = 0  # the last inbound message read into _people


def person_id_of(platform: str, user_id: Any) -> str:
    """MaiBot's get_person_id: md5 of "<platform>_<user_id>" (a "prefix-platform" counts as "platform")."""
    if "-" in platform:
        platform = platform.split("-")[1]
    return hashlib.md5(f"{platform}_{user_id}".encode()).hexdigest()


def _refresh() -> None:
    """Adds the senders of inbound messages stored since the last read (and private chats' users)."""
    global _seen_pk
    from chat.models import ChatSession, ChatType, Message

    with _lock:
        start = _seen_pk
    newest = Message.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    if newest < start:  # the table was emptied or restored: read it again
        start = 0
    found = {person_id_of(p, u): (p, u) for p, u in _bot_accounts()}
    if not start:
        private = ChatSession.objects.filter(chat_type=ChatType.PRIVATE).exclude(user_id="")
        found.update({person_id_of(p, u): (p, u) for p, u in private.values_list("platform", "user_id")})
    inbound = Message.objects.filter(direction="in").exclude(sender_id="").order_by("pk")
    last = start
    while True:
        rows = list(inbound.filter(pk__gt=last).values_list("pk", "session__platform", "sender_id")[:BATCH])
        found.update({person_id_of(p, u): (p, u) for _, p, u in rows})
        if len(rows) < BATCH:
            break
        last = rows[-1][0]
    with _lock:
        if not start:
            _people.clear()
        _people.update(found)
        _seen_pk = max(newest, last)


def _bot_accounts() -> list[tuple[str, str]]:
    from chat.models import AdapterPlatform
    from core.config import get_config

    learned = AdapterPlatform.objects.exclude(bot_account="").values_list("platform", "bot_account")
    return [*get_config().bot.platform_accounts.items(), *learned]


def _resolve(person_id: str) -> tuple[str, str] | None:
    with _lock:
        known = _people.get(person_id)
    if known is None:
        _refresh()
        with _lock:
            known = _people.get(person_id)
    return known


def _values(person_id: str, platform: str, user_id: str) -> dict[str, Any]:
    from chat.accounts import bot_account
    from chat.models import ChatSession, Message
    from core.config import get_config

    values: dict[str, Any] = dict.fromkeys(FIELDS)
    values.update(person_id=person_id, platform=platform, user_id=user_id, is_known=True, memory_points=[])
    if user_id == bot_account(platform):
        name = get_config().bot.nickname
        return {**values, "nickname": name, "person_name": name, "group_cardname_list": [], "know_times": 0}
    theirs = Message.objects.filter(direction="in", session__platform=platform, sender_id=user_id)
    latest, first = theirs.order_by("-time").first(), theirs.order_by("time").first()
    nickname = latest.sender_nickname if latest else ""
    if not nickname:
        chat = ChatSession.objects.filter(platform=platform, chat_type="private", user_id=user_id).first()
        nickname = chat.user_nickname if chat else ""
    cards: dict[str, str] = {}
    in_groups = theirs.filter(session__chat_type="group").exclude(sender_cardname="").order_by("-time")
    for group_id, card in in_groups.values_list("session__group_id", "sender_cardname")[:500]:
        if group_id not in cards and len(cards) < MAX_GROUPS:
            cards[group_id] = card
    values.update(
        nickname=nickname,
        person_name=nickname or None,
        know_times=theirs.count(),
        know_since=first.time.timestamp() if first else None,
        last_know=latest.time.timestamp() if latest else None,
        group_cardname_list=[{"group_id": g, "group_cardname": c} for g, c in cards.items()],
    )
    return values


def _get_value(person_id: str, field: str) -> dict[str, Any]:
    known = _resolve(person_id)
    if known is None:
        unknown = {"person_id": person_id, "is_known": False, "person_name": f"未知用户{person_id[:4]}"}
        if field in unknown:
            return {"success": True, "value": unknown[field]}
        return {"success": False, "error": f"person {person_id} is not known here: no {field}"}
    return {"success": True, "value": _values(person_id, *known)[field]}


async def get_id(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    platform, user_id = str(args.get("platform") or "").strip(), str(args.get("user_id") or "").strip()
    if not platform or not user_id:
        return {"success": False, "error": "缺少必要参数 platform 或 user_id"}
    if len(platform) > 64 or len(user_id) > MAX_ID:
        return {"success": False, "error": "platform or user_id is too long"}
    return {"success": True, "person_id": person_id_of(platform, user_id)}


async def get_value(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    person_id, field = str(args.get("person_id") or "").strip(), str(args.get("field_name") or "").strip()
    if not person_id or not field:
        return {"success": False, "error": "缺少必要参数 person_id 或 field_name"}
    if field not in FIELDS:
        return {"success": False, "error": f"'Person' object has no attribute '{field[:64]}'"}
    result = await db(lambda: _get_value(person_id[:64], field))
    if result["success"] and result["value"] is None:
        result["value"] = args.get("default")
    return result


def _by_name(name: str) -> str:
    from chat.models import ChatSession, Message

    senders = Message.objects.filter(direction="in").order_by("-time")
    for lookup in ("sender_nickname", "sender_cardname"):
        found = senders.filter(**{lookup: name}).values_list("session__platform", "sender_id").first()
        if found and found[1]:
            return person_id_of(*found)
    chat = ChatSession.objects.filter(chat_type="private", user_nickname=name).exclude(user_id="").first()
    return person_id_of(chat.platform, chat.user_id) if chat else ""


async def get_id_by_name(record: PluginRecord, args: dict[str, Any]) -> dict[str, Any]:
    name = str(args.get("person_name") or "").strip()
    if not name:
        return {"success": False, "error": "缺少必要参数 person_name"}
    return {"success": True, "person_id": await db(lambda: _by_name(name[:255]))}
