"""Reminders without a model: the commands the offline planner (chat.offline) asks about typed text.

In a private chat they understand, in English and Chinese (times as scheduling.timespec reads them):

    remind me in 10 minutes to drink water      remind me at 8:30 to call mom
    remind me tomorrow at 8 to ...              remind me to drink water in 10 minutes
    提醒我10分钟后喝水                            10分钟后提醒我喝水
    明天早上8点提醒我开会                          下午3点半提醒我…
    /schedule <time> <text>   (time: ISO 8601, "in 10 minutes", "at 8:30", "10分钟后", "明天8点")
    /list                     (pending scheduled messages of this chat)
    /cancel <id>              (/cancel all cancels every pending one)

A reminder is scheduled through the same tool the model would call (so it is recorded as a tool call
and the ScheduledMessage links to it) and confirmed in the chat; at its time the dispatcher sends
"⏰ <text>" with no further thought. In a group chat every `/…` command is answered with the reason
it cannot be done there (scheduled messages are for private chats).
"""

from __future__ import annotations

import re
from typing import Any

from django.utils import timezone

from chat.components import Command, CommandTurn, register_command
from core.config import get_config
from scheduling.timespec import TimeSpecError, split_spoken_time

TEXTS = {
    "zh": {
        "help": "我只能帮你设提醒。）试试“提醒我10分钟后喝水”、“/schedule 明天8点 开会”、“/list” 或 “/cancel <编号>”。",
        "scheduled": "好的，{when} 提醒你：{text}（编号 {id}）",
        "reminder": "⏰ {text}",
        "none": "现在没有待发送的提醒。",
        "list_head": "待发送的提醒：",
        "cancelled": "已取消：{ids}",
        "error": "没办法：{message}",
        "bad_time": "没看懂时间：{message}",
        "usage_schedule": "用法：/schedule <时间> <内容>，例如 /schedule 10分钟后 喝水",
        "usage_cancel": "用法：/cancel <编号>，或 /cancel all",
        "empty_text": "要提醒什么呢？",
    },
    "en": {
        "help": "so I can only set reminders.) Try "
        '"remind me in 10 minutes to drink water", "/schedule tomorrow at 8 meeting", "/list" or "/cancel <id>".',
        "scheduled": "OK, I'll remind you at {when}: {text} (id {id})",
        "reminder": "⏰ {text}",
        "none": "No pending reminders.",
        "list_head": "Pending reminders:",
        "cancelled": "Cancelled: {ids}",
        "error": "Sorry: {message}",
        "bad_time": "I could not read the time: {message}",
        "usage_schedule": "Usage: /schedule <time> <text>, e.g. /schedule in 10 minutes drink water",
        "usage_cancel": "Usage: /cancel <id>, or /cancel all",
        "empty_text": "Remind you of what?",
    },
}


def _t(key: str, **kw: Any) -> str:
    lang = get_config().bot.language.split("-")[0]
    return TEXTS.get(lang, TEXTS["en"])[key].format(**kw)


_EN_REMIND = re.compile(r"^(?:please\s+)?remind\s+me\s+(?P<rest>.+)$", re.I | re.S)
_EN_TO_LAST = re.compile(r"^to\s+(?P<what>.+?)\s+(?P<when>(?:in|at|tomorrow|today)\s+.+)$", re.I | re.S)
_ZH_REMIND_FIRST = re.compile(r"^(?:请)?(?:你)?提醒我\s*(?:在)?\s*(?P<rest>.+)$", re.S)
_ZH_REMIND_AFTER = re.compile(r"^(?:请)?(?:在)?\s*(?P<when>.+?)\s*(?:的时候)?\s*(?:请)?提醒我\s*(?P<what>.*)$", re.S)


def _local_text(iso: str) -> str:
    return iso.replace("T", " ")[:19]


def _schedule(turn: CommandTurn, when_text: str, what: str) -> None:
    cfg = get_config()
    try:
        found = split_spoken_time(when_text, cfg.tzinfo, now=timezone.now())
    except TimeSpecError as exc:
        turn.answer(_t("bad_time", message=str(exc)), "offline_error")
        return
    if found is None:
        turn.answer(_t("bad_time", message=when_text), "offline_error")
        return
    send_at, leftover = found
    what = " ".join(p for p in (leftover, what) if p).strip()
    what = re.sub(r"^(?:to|要|去)\s*", "", what, flags=re.I).strip(" ，,。.")
    if not what:
        turn.answer(_t("empty_text"), "offline_error")
        return
    result = turn.tool("schedule_private_message", send_at=send_at.isoformat(), message_text=_t("reminder", text=what))
    if result.get("ok"):
        turn.answer(
            _t("scheduled", when=_local_text(result["send_at"]), text=what, id=result["task_id"]), "offline_schedule"
        )
    else:
        turn.answer(_t("error", message=result["error"]["message"]), "offline_error")


def _list(turn: CommandTurn) -> None:
    result = turn.tool("list_scheduled_private_messages")
    if not result.get("ok"):
        text = _t("error", message=result["error"]["message"])
    elif not result["tasks"]:
        text = _t("none")
    else:
        lines = [_t("list_head")]
        lines += [f"{t['task_id']}  {_local_text(t['send_at'])}  {t['message_text']}" for t in result["tasks"]]
        text = "\n".join(lines)
    turn.answer(text, "offline_list")


def _cancel(turn: CommandTurn, args: str) -> None:
    if not args:
        turn.answer(_t("usage_cancel"), "offline_error")
        return
    task_id = None if args.lower() in {"all", "全部"} else args.split()[0]
    result = turn.tool("cancel_scheduled_private_message", task_id=task_id)
    if result.get("ok"):
        turn.answer(_t("cancelled", ids=", ".join(result["cancelled_task_ids"]) or "-"), "offline_cancel")
    else:
        turn.answer(_t("error", message=result["error"]["message"]), "offline_error")


def slash_command(turn: CommandTurn, text: str) -> bool:
    """/schedule, /list and /cancel (in a group chat: every /… gets the reason it cannot be done)."""
    if not text.startswith("/"):
        return False
    if not turn.session.is_private:
        turn.answer(_t("error", message="scheduled messages are for private chats only"), "offline_error")
        return True
    name, _, args = text[1:].partition(" ")
    name, args = name.lower(), args.strip()
    if name == "schedule":
        if args:
            _schedule(turn, args, "")
        else:
            turn.answer(_t("usage_schedule"), "offline_error")
    elif name == "list":
        _list(turn)
    elif name == "cancel":
        _cancel(turn, args)
    else:
        return False
    return True


def reminder_request(turn: CommandTurn, text: str) -> bool:
    """A reminder asked for in words (private chats); True when the text was one."""
    if not turn.session.is_private:
        return False
    if m := _EN_REMIND.match(text):
        rest = m.group("rest").strip()
        if last := _EN_TO_LAST.match(rest):
            _schedule(turn, last.group("when"), last.group("what"))
        else:
            _schedule(turn, rest, "")
        return True
    if m := _ZH_REMIND_FIRST.match(text):
        _schedule(turn, m.group("rest"), "")
        return True
    if (m := _ZH_REMIND_AFTER.match(text)) and m.group("when"):
        _schedule(turn, m.group("when"), m.group("what"))
        return True
    return False


def register_commands() -> None:
    register_command(
        Command(
            name="scheduling.slash",
            handle=slash_command,
            order=10,
            help={lang: texts["help"] for lang, texts in TEXTS.items()},
        )
    )
    register_command(Command(name="scheduling.reminder", handle=reminder_request, order=20))
