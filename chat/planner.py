"""The chat planner: one observe → plan → execute cycle of a session, its prompt, and its record.

A cycle (run by the session's runtime, chat/runtime.py) gets the messages that arrived since the
last one, renders the prompt, calls the model once with the tools (`chat.agent.llm.complete`, purpose
"planner"), executes the tool calls, and feeds their results back in the same cycle until the model
ends its turn with `reply` / `no_reply` / `send_emoji` or `chat.max_rounds` calls were made. Every
cycle is a PlannerCycle row (phase timings, action, reasoning, outcome, replanned, error, the full
conversation sent); every tool call a ToolCallRecord; every model call an LLMCall linked to it.

When does the bot speak?
* Private chats: every new message is considered (one cycle per debounced burst).
* Group chats: a new message *mentions* the bot when its text contains the nickname or one of
  `bot.alias_names` (case-insensitive), when it has an `@<name:id>` mention whose name is one of
  those or whose id is the message's receiver id (the bot's account, when the adapter sends
  receiver_info), or when it quotes one of the bot's own messages. A mention always starts a cycle.
  Otherwise the model is asked only once enough unaddressed messages have piled up:
      backlog >= ceil(1 / chat.talk_frequency) * 2 ** min(silent_streak, 4)
  where backlog counts unaddressed messages since the bot last planned, and silent_streak counts the
  consecutive unaddressed cycles that ended in no_reply (reset by a reply or a mention). With
  talk_frequency 0 the bot speaks only when mentioned. Messages below the bar cost no LLM call;
  they stay in the history the next cycle sees.
* After an LLM-planned `no_reply` the runtime looks once more after `chat.no_reply_timeout` seconds
  without new messages (trigger "no_reply_timeout"); that look never repeats until a new message
  comes, so a silent chat costs at most one extra call.

Replanning: if new messages arrive while the model is thinking, before any tool has run, the
answer is discarded unexecuted and the model is asked once more with them (replanned=True); later
arrivals wait for the next cycle.

Plain content instead of a tool call: in a private chat, non-empty text that looks like a chat
message (not JSON, not tool-call markup, at most MAX_REPLY_CHARS) is sent as the reply and
recorded as a `reply` tool call with `from_content: true`. Anything else (and any content in a group
chat) is not sent: the cycle ends as no_reply with the text kept in its outcome. Provider errors
(HTTP 5xx, timeouts, malformed answers) end the cycle with `error` set and nothing sent; the
runtime goes on with the next message. Unknown tools and bad arguments become error tool results
the model sees (and they are recorded), never exceptions.

Offline mode (no model configured): the clearly labelled offline planner (chat/offline.py) answers
instead, recorded as a cycle with no LLM call.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from chat.actions import MAX_REPLY_CHARS
from chat.actions import reply as reply_tool
from chat.agent import llm
from chat.agent.prompt import Prompt, prompt_manager
from chat.components import Tool, ToolContext, context_blocks, error, registry
from chat.models import ChatSession, CycleKind, Direction, Message, PlannerCycle, SourceKind, ToolCallRecord
from maibot.config import BotConfig, format_instant, get_config

logger = logging.getLogger(__name__)

ENDING_ACTIONS = ("reply", "send_emoji", "no_reply")

# --- prompts ----------------------------------------------------------------------------------------

SYSTEM_PROMPT = "planner.system"
TURN_PROMPT = "planner.turn"

TOOL_GUIDANCE = """\
How you act: you only act through tools.
- To say something, call `reply` (one message; quote a message by its #id only when it helps).
- To stay silent, call `no_reply` with a short reason. Do not talk just to fill silence; in group
  chats speak when addressed or when you really have something to add, and never twice in a row.
- `send_emoji` sends a sticker when one fits better than words (only offered when stickers exist).
- Other tools may be offered; use them when they help. Each turn ends with reply, send_emoji or
  no_reply."""

SCHEDULING_GUIDANCE = """\
Reminders and promised follow-ups: use `schedule_private_message` (the text you write is sent as is
at that time, with no further thought), `list_scheduled_private_messages` and
`cancel_scheduled_private_message`. Compute send_at from the current time below and give it as
ISO 8601 with the offset. Then confirm to the person with `reply`."""

prompt_manager.add_prompt(
    SYSTEM_PROMPT,
    Prompt(
        SYSTEM_PROMPT,
        [
            ("persona", "{persona}"),
            ("identity", "Your name is {nickname}.{aliases} {chat_description}"),
            ("tool_guidance", TOOL_GUIDANCE),
            ("scheduling_guidance", "{scheduling_guidance}"),
        ],
        construct={
            "scheduling_guidance": lambda c: SCHEDULING_GUIDANCE if c["private"] else "",
            "aliases": lambda c: f" People also call you {', '.join(c['alias_names'])}." if c["alias_names"] else "",
        },
    ),
    system=True,
)
prompt_manager.add_prompt(
    TURN_PROMPT,
    Prompt(
        TURN_PROMPT,
        [
            ("context_blocks", "{context_blocks}"),
            ("cycle_records", "{cycle_records}"),
            ("history", "{history}"),
            ("now", "Current time: {now}"),
            ("instruction", "{instruction}"),
        ],
        construct={
            "context_blocks": lambda c: "\n\n".join(f"## {name}\n{text}" for name, text in c["blocks"]),
            "cycle_records": lambda c: _render_cycle_records(c["cycles"], c["tz"]),
            "history": lambda c: _render_history(c["history"], c["new_ids"], c["cfg"], c.get("rendered")),
        },
    ),
    system=True,
)


def _speaker(message: HistoryLine, cfg: BotConfig) -> str:
    if message.direction == Direction.OUT:
        marks = {
            SourceKind.REPLY: "you",
            SourceKind.SCHEDULED_SEND: "you, scheduled message",
            SourceKind.TIMER: "you, on your own",
            SourceKind.PROACTIVE: "you, proactive message",
            SourceKind.ADMIN: "sent in your name by the operator",
        }
        return f"{cfg.bot.nickname} ({marks.get(message.source_kind, 'you')})"
    return message.sender_cardname or message.sender_nickname or message.sender_id or "someone"


def render_history_line(m: HistoryLine, cfg: BotConfig, tz) -> str:
    ref = f"#{m.platform_message_id} " if m.platform_message_id else ""
    quote = f" (quoting #{m.reply_to_platform_id})" if m.reply_to_platform_id else ""
    text = (m.text or "").replace("\n", "\n    ")
    return f"{ref}[{m.time.astimezone(tz):%m-%d %H:%M:%S}] {_speaker(m, cfg)}{quote}: {text}"


def _render_history(history: list[HistoryLine], new_ids: set[int], cfg: BotConfig, rendered=None) -> str:
    if not history:
        return "Chat history: (empty)"
    tz = cfg.tzinfo
    lines = ["Chat history (oldest first):"]
    marked = False
    for m in history:
        if m.pk in new_ids and not marked:
            lines.append("--- new since your last turn ---")
            marked = True
        lines.append(rendered(m) if rendered else render_history_line(m, cfg, tz))
    return "\n".join(lines)


def _render_cycle_records(cycles: list[PlannerCycle], tz) -> str:
    if not cycles:
        return ""
    lines = ["Your last turns (oldest first):"]
    for c in cycles:
        parts = [f"[{c.started_at.astimezone(tz):%m-%d %H:%M}] {c.action or '?'}"]
        if c.reasoning:
            parts.append(f"why: {c.reasoning[:200]}")
        if c.outcome:
            parts.append(f"outcome: {c.outcome[:200]}")
        if c.error:
            parts.append(f"error: {c.error[:120]}")
        lines.append(" — ".join(parts))
    return "\n".join(lines)


def _chat_description(session: ChatSession) -> str:
    if session.is_private:
        who = session.user_cardname or session.user_nickname or session.user_id
        return f"You are in a private chat with {who} on {session.platform}."
    return f"You are in the group chat {session.group_name or session.group_id} on {session.platform}."


def _instruction(trigger: str, *, private: bool, mentioned: bool) -> str:
    if trigger == "no_reply_timeout":
        return (
            "Nobody has written since you chose to stay silent. Follow up once if it is natural, "
            "otherwise call no_reply."
        )
    if private:
        return "Decide what to do about the new messages: act with the tools, then reply or no_reply."
    if mentioned:
        return "You were mentioned in the new messages: answer with reply (or no_reply if nothing fits)."
    return "Nobody addressed you. Speak only if you have something worth adding; otherwise call no_reply."


# --- mentions and the group-chat rule -----------------------------------------------------------------

_AT_MENTION = re.compile(r"@<([^:<>]+):([^<>]*)>")


def bot_names(cfg: BotConfig) -> list[str]:
    return [n for n in {cfg.bot.nickname, *cfg.bot.alias_names} if n]


def mentions_bot(message: Message, cfg: BotConfig, bot_message_ids: set[str] = frozenset()) -> bool:
    """True when an inbound message addresses the bot (see the module docstring)."""
    names = [n.casefold() for n in bot_names(cfg)]
    text = (message.text or "").casefold()
    if any(name in text for name in names):
        return True
    own_id = getattr(message, "receiver_id", "") or ""  # the bot's account, when the adapter says so
    for nick, at_id in _AT_MENTION.findall(message.text or ""):
        if nick.strip().casefold() in names or (own_id and at_id.strip() == own_id):
            return True
    return bool(message.reply_to_platform_id and message.reply_to_platform_id in bot_message_ids)


def group_bar(talk_frequency: float, silent_streak: int) -> float:
    """How many unaddressed group messages it takes before the model is asked (inf: never)."""
    if talk_frequency <= 0:
        return math.inf
    return math.ceil(1 / talk_frequency) * 2 ** min(silent_streak, 4)


# --- plain content --------------------------------------------------------------------------------------

_MARKUP = re.compile(r"<\|?/?tool|\"(name|arguments|function)\"\s*:|^\s*(\{|\[|```)|\bno_reply\b", re.IGNORECASE)


def content_as_reply(content: str) -> str | None:
    """The model's plain text if it can be sent as a chat message as it is, else None."""
    text = (content or "").strip()
    if not text or len(text) > MAX_REPLY_CHARS or _MARKUP.search(text):
        return None
    return text


# --- one cycle ------------------------------------------------------------------------------------------


@dataclass
class CycleResult:
    cycle: PlannerCycle
    action: str
    mentioned: bool = False
    llm_calls: int = 0


@dataclass
class _Prepared:
    messages: list[dict[str, Any]]
    tools: list[Tool]


@dataclass
class _RoundOutcome:
    ended: bool = False
    closed: bool = False
    action: str = ""
    reasoning: list[str] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    tool_messages: list[dict[str, Any]] = field(default_factory=list)


class HistoryLine(NamedTuple):
    """The fields of a message the prompt shows (a full Message costs ~4× as much to load)."""

    pk: int
    direction: str
    source_kind: str
    platform_message_id: str
    sender_id: str
    sender_nickname: str
    sender_cardname: str
    text: str
    reply_to_platform_id: str
    time: datetime


def _history(session: ChatSession, window: int) -> list[HistoryLine]:
    rows = Message.objects.filter(session=session).order_by("-time", "-id").values_list(*HistoryLine._fields)
    return [HistoryLine(*row) for row in reversed(rows[:window])]


def _recent_cycles(session: ChatSession, n: int, *, exclude_pk: int | None) -> list[PlannerCycle]:
    if not n:
        return []
    return list(
        PlannerCycle.objects.filter(session=session, kind=CycleKind.CHAT)
        .exclude(pk=exclude_pk)
        .only("started_at", "action", "reasoning", "outcome", "error")  # not the big prompt
        .order_by("-started_at")[:n]
    )[::-1]


class HistoryCache:
    """A runtime's copy of its session's recent messages, topped up with only the rows stored since
    the last cycle (its own replies, scheduled sends from the cluster, new inbound messages alike)."""

    def __init__(self) -> None:
        self.lines: deque[HistoryLine] = deque()
        self.window = 0
        self.last_pk = 0
        self._rendered: dict[int, str] = {}
        self._render_key: tuple = ()
        self._cycles: deque[PlannerCycle] | None = None

    def recent_cycles(self, session: ChatSession, n: int, *, exclude_pk: int | None) -> list[PlannerCycle]:
        """The session's last chat cycles: read once, then kept as the runtime records them."""
        if self._cycles is None or self._cycles.maxlen != n:
            self._cycles = deque(_recent_cycles(session, n, exclude_pk=exclude_pk), maxlen=n)
        return [c for c in self._cycles if c.pk != exclude_pk]

    def remember_cycle(self, cycle: PlannerCycle) -> None:
        if self._cycles is not None:
            # Only what the prompt shows: the full conversation stays in the database.
            self._cycles.append(
                PlannerCycle(
                    pk=cycle.pk,
                    started_at=cycle.started_at,
                    action=cycle.action,
                    reasoning=cycle.reasoning,
                    outcome=cycle.outcome,
                    error=cycle.error,
                )
            )

    def rendered(self, cfg: BotConfig):
        """A line renderer that renders each message once (per nickname and time zone)."""
        tz = cfg.tzinfo
        key = (cfg.bot.nickname, tz.key)
        if key != self._render_key:
            self._rendered, self._render_key = {}, key
        live = {line.pk for line in self.lines}
        for pk in [pk for pk in self._rendered if pk not in live]:
            del self._rendered[pk]

        def render(m: HistoryLine) -> str:
            text = self._rendered.get(m.pk)
            if text is None:
                text = self._rendered[m.pk] = render_history_line(m, cfg, tz)
            return text

        return render

    def refresh(self, session: ChatSession, window: int) -> list[HistoryLine]:
        if window != self.window or not self.lines:
            self.lines = deque(_history(session, window), maxlen=window)
            self.window = window
        else:
            rows = (
                Message.objects.filter(session=session, pk__gt=self.last_pk)
                .order_by("time", "id")
                .values_list(*HistoryLine._fields)
            )
            self.lines.extend(HistoryLine(*row) for row in rows)
        if self.lines:
            self.last_pk = max(self.last_pk, max(line.pk for line in self.lines))
        return list(self.lines)


def prepare(
    *,
    session: ChatSession,
    new_messages: list[Message],
    trigger: str,
    mentioned: bool,
    cycle: PlannerCycle,
    history_cache: HistoryCache | None = None,
) -> _Prepared:
    """Read what the prompt needs and render it (sync: run it in a thread)."""
    cfg = get_config()
    tz = cfg.tzinfo
    window = cfg.chat.history_window
    history = history_cache.refresh(session, window) if history_cache else _history(session, window)
    if history_cache:
        cycles = history_cache.recent_cycles(session, cfg.chat.cycle_records, exclude_pk=cycle.pk)
    else:
        cycles = _recent_cycles(session, cfg.chat.cycle_records, exclude_pk=cycle.pk)
    tools = registry.available(ToolContext(session=session, cycle=cycle))
    now = timezone.now()
    system = prompt_manager.get_prompt(SYSTEM_PROMPT).render(
        persona=cfg.bot.persona,
        nickname=cfg.bot.nickname,
        alias_names=[n for n in cfg.bot.alias_names if n != cfg.bot.nickname],
        chat_description=_chat_description(session),
        private=session.is_private,
    )
    turn = prompt_manager.get_prompt(TURN_PROMPT).render(
        cfg=cfg,
        tz=tz,
        blocks=context_blocks(session),
        cycles=cycles,
        history=history,
        new_ids={m.pk for m in new_messages},
        rendered=history_cache.rendered(cfg) if history_cache else None,
        now=f"{format_instant(now, tz)} ({now.astimezone(tz):%A}, time zone {tz.key})",
        instruction=_instruction(trigger, private=session.is_private, mentioned=mentioned),
    )
    return _Prepared(
        messages=[{"role": "system", "content": system}, {"role": "user", "content": turn}],
        tools=tools,
    )


def cycle_open(
    *,
    session: ChatSession,
    trigger: str,
    started_at: datetime,
    new_messages: list[Message],
    mentioned: bool,
    history_cache: HistoryCache | None = None,
    cycle_id: uuid.UUID | None = None,
) -> tuple[PlannerCycle, _Prepared | Exception]:
    """Open the cycle's record and prepare its prompt, in one trip to a thread."""
    cycle = PlannerCycle.objects.create(
        cycle_id=cycle_id or uuid.uuid4(),
        session=session,
        kind=CycleKind.CHAT,
        started_at=started_at,
        trigger=trigger[:255],
    )
    try:
        return cycle, prepare(
            session=session,
            new_messages=new_messages,
            trigger=trigger,
            mentioned=mentioned,
            cycle=cycle,
            history_cache=history_cache,
        )
    except Exception as exc:  # recorded on the cycle by the caller
        logger.exception("preparing planner cycle %s failed", cycle.cycle_id)
        return cycle, exc


def _rank(action: str) -> int:
    return ENDING_ACTIONS.index(action) if action in ENDING_ACTIONS else len(ENDING_ACTIONS)


def _bind(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> str:
    try:
        inspect.signature(tool.func).bind(ctx, **arguments)
    except TypeError as exc:
        return str(exc)
    return ""


def execute_round(
    *,
    session: ChatSession,
    cycle: PlannerCycle,
    round_no: int,
    result: llm.LLMResult,
    tools: list[Tool],
    shared: dict,
    close: Callable[[_RoundOutcome], dict[str, Any]] | None = None,
) -> _RoundOutcome:
    """Run one answer's tool calls in order and record them (sync: run it in a thread). When the
    round ends the cycle and `close` is given, the cycle record is closed in the same trip."""
    by_name = {t.name: t for t in tools}
    out = _RoundOutcome()
    records = []
    for call in result.tool_calls:
        tool = by_name.get(call.name)
        ctx = ToolContext(session=session, tool_call_id=call.id, cycle=cycle, extra=shared)
        if tool is None:
            res = error("unknown_tool", f"there is no tool {call.name!r}; use one of: {', '.join(by_name)}")
        elif call.arguments is None:
            res = error("invalid_arguments", f"the arguments are not a JSON object: {call.argument_error}")
        elif problem := _bind(tool, ctx, call.arguments):
            res = error("invalid_arguments", problem)
        else:
            try:
                res = tool(ctx, **call.arguments)
                if not isinstance(res, dict):
                    raise TypeError(f"tool returned {type(res).__name__}, not a dict")
            except Exception as exc:
                logger.exception("tool %s failed in cycle %s", call.name, cycle.cycle_id)
                res = error("tool_failed", f"{type(exc).__name__}: {exc}"[:500])
        # What is recorded is exactly what the model is told (and anything odd becomes text).
        content = json.dumps(res, ensure_ascii=False, default=str)
        res = json.loads(content)
        succeeded = bool(res.get("ok"))
        records.append(
            ToolCallRecord(
                cycle=cycle,
                round=round_no,
                tool_call_id=call.id,
                name=call.name[:128],
                arguments=call.arguments if call.arguments is not None else {},
                raw_arguments=call.raw_arguments,
                result=res,
                ok=succeeded,
            )
        )
        out.tool_messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if succeeded and tool is not None and tool.ends_cycle:
            out.ended = True
            # reply outranks send_emoji outranks no_reply (outranks other ending tools) as the action.
            if not out.action or _rank(call.name) < _rank(out.action):
                out.action = call.name
            if call.name == "reply":
                out.outcome.append(f"said: {call.arguments.get('text', '')}"[:500])
            elif call.name == "send_emoji":
                out.outcome.append(f"sent emoji: {res.get('emoji', '')}")
            elif call.name == "no_reply":
                out.reasoning.append(str(call.arguments.get("reason", "")))
                out.outcome.append("stayed silent")
        elif not succeeded:
            err = res.get("error")
            out.outcome.append(f"{call.name} failed: {err.get('code', '?') if isinstance(err, dict) else err}")
        else:
            out.outcome.append(f"{call.name} ok")
    # The records (and, on the last round, the cycle's own record) in one transaction; the tools ran
    # outside it, so a slow tool never holds the database's write lock.
    with transaction.atomic():
        ToolCallRecord.objects.bulk_create(records)
        if close is not None and out.ended:
            cycle_close(cycle=cycle, fields=close(out))
            out.closed = True
    return out


def content_fallback(*, session: ChatSession, cycle: PlannerCycle, content: str, round_no: int, shared: dict) -> str:
    """Plain text instead of a tool call: send it as the reply (private, sane) or not at all."""
    text = content_as_reply(content) if session.is_private else None
    if text is None:
        return "no_reply"
    ctx = ToolContext(session=session, tool_call_id="", cycle=cycle, extra=shared)
    res = reply_tool(ctx, text=text)
    ToolCallRecord.objects.create(
        cycle=cycle,
        round=round_no,
        name="reply",
        arguments={"text": text, "from_content": True},
        result=res,
        ok=bool(res.get("ok")),
    )
    return "reply" if res.get("ok") else "no_reply"


def cycle_close(*, cycle: PlannerCycle, fields: dict[str, Any]) -> None:
    for k, v in fields.items():
        setattr(cycle, k, v)
    cycle.ended_at = timezone.now()
    cycle.save(update_fields=[*fields, "ended_at"])


def cycle_abandon(*, cycle_id: uuid.UUID) -> None:
    PlannerCycle.objects.filter(cycle_id=cycle_id, ended_at__isnull=True).update(
        action="cancelled", error="the runtime was stopped during the cycle", ended_at=timezone.now()
    )


_abandon = sync_to_async(cycle_abandon)
_prepare = sync_to_async(prepare)
_open = sync_to_async(cycle_open)
_execute = sync_to_async(execute_round)
_fallback = sync_to_async(content_fallback)
_close = sync_to_async(cycle_close)


class Stopwatch:
    """Milliseconds per phase: observe, prompt (open the record, read, render), plan (the model calls,
    of which llm_ms is the providers' own HTTP time), execute (tools), record (assembling the record;
    the one UPDATE that stores it is the only untimed step), total."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._t0 = time.perf_counter()

    def add(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[phase] = round(self.timings.get(phase, 0.0) + (now - since) * 1000, 3)
        return now

    def total(self) -> None:
        self.timings["total_ms"] = round((time.perf_counter() - self._t0) * 1000, 3)


async def run_cycle(
    *,
    session: ChatSession,
    new_messages: list[Message],
    trigger: str,
    mentioned: bool,
    has_news: Callable[[], bool],
    observe_more: Callable[[], Awaitable[list[Message]]],
    observe_ms: float = 0.0,
    history_cache: HistoryCache | None = None,
) -> CycleResult:
    """One cycle with the model. `has_news()` tells whether messages came in since the last observe;
    `observe_more()` fetches them (for the one replan)."""
    cfg = get_config()
    watch = Stopwatch()
    watch.timings["observe_ms"] = round(observe_ms, 3)
    t = time.perf_counter()
    cycle_id = uuid.uuid4()
    try:
        cycle, prepared = await _open(
            session=session,
            trigger=trigger,
            started_at=timezone.now(),
            new_messages=new_messages,
            mentioned=mentioned,
            history_cache=history_cache,
            cycle_id=cycle_id,
        )
    except asyncio.CancelledError:
        # Stopped while the record was being opened: close it if it was written.
        await _abandon(cycle_id=cycle_id)
        raise
    fields: dict[str, Any] = {"action": "", "reasoning": "", "outcome": "", "error": "", "replanned": False}
    shared: dict[str, Any] = {}
    reasoning: list[str] = []
    outcome: list[str] = []
    llm_calls = 0
    llm_ms = 0.0
    conversation: list[dict[str, Any]] = []
    closed = False

    def finalize() -> dict[str, Any]:
        nonlocal t
        watch.timings["llm_ms"] = round(llm_ms, 3)
        fields["reasoning"] = "\n".join(r for r in reasoning if r)[:4000]
        fields["outcome"] = "; ".join(o for o in outcome if o)[:4000]
        fields["prompt"] = conversation
        t = watch.add("record_ms", t)
        watch.total()
        fields["timings"] = watch.timings
        return fields

    def close_after(done: _RoundOutcome) -> dict[str, Any]:
        # Runs in the tool thread while this coroutine waits: the final round's results and the
        # record go to the database in one trip.
        nonlocal t
        t = watch.add("execute_ms", t)
        reasoning.extend(r for r in done.reasoning if r)
        outcome.extend(done.outcome)
        conversation.extend(done.tool_messages)
        fields["action"] = done.action
        return finalize()

    try:
        if isinstance(prepared, Exception):
            raise prepared
        conversation = list(prepared.messages)
        schemas = [tool.schema() for tool in prepared.tools]
        t = watch.add("prompt_ms", t)
        tools_ran = False
        round_no = 0
        while True:
            if round_no >= cfg.chat.max_rounds:
                fields["action"] = "max_rounds"
                fields["error"] = f"the model did not end its turn within {cfg.chat.max_rounds} calls"
                break
            result = await llm.complete(
                purpose="planner", messages=conversation, tools=schemas, session_id=session.pk, cycle_id=cycle.pk
            )
            llm_calls += 1
            llm_ms += result.latency_ms
            t = watch.add("plan_ms", t)
            if not tools_ran and not fields["replanned"] and has_news():
                # Stale: someone spoke while the model was thinking. Ask again, once, with them.
                more = await observe_more()
                if more:
                    new_messages = [*new_messages, *more]
                    fields["replanned"] = True
                    stale = ", ".join(c.name for c in result.tool_calls) or result.error or "text"
                    outcome.append(f"discarded a stale plan ({stale}) for {len(more)} new message(s)")
                    prepared = await _prepare(
                        session=session,
                        new_messages=new_messages,
                        trigger=trigger,
                        mentioned=mentioned,
                        cycle=cycle,
                        history_cache=history_cache,
                    )
                    conversation = list(prepared.messages)
                    schemas = [tool.schema() for tool in prepared.tools]
                    t = watch.add("prompt_ms", t)
                    round_no += 1
                    continue
            if not result.ok:
                fields["action"] = "error"
                fields["error"] = result.error
                break
            if result.content and result.tool_calls:
                reasoning.append(result.content.strip())
            if not result.tool_calls:
                action = await _fallback(
                    session=session, cycle=cycle, content=result.content, round_no=round_no, shared=shared
                )
                fields["action"] = action
                if action == "reply":
                    reasoning.append("answered in plain text; sent as the reply")
                    outcome.append(f"said: {result.content.strip()}"[:500])
                else:
                    outcome.append(f"plain text not sent: {result.content.strip()[:300]}" if result.content else "")
                t = watch.add("execute_ms", t)
                break
            conversation.append(result.assistant_message or {"role": "assistant", "content": result.content})
            done = await _execute(
                session=session,
                cycle=cycle,
                round_no=round_no,
                result=result,
                tools=prepared.tools,
                shared=shared,
                close=close_after,
            )
            tools_ran = True
            if done.closed:
                closed = True
                break
            t = watch.add("execute_ms", t)
            reasoning.extend(r for r in done.reasoning if r)
            outcome.extend(done.outcome)
            conversation.extend(done.tool_messages)
            round_no += 1
    except asyncio.CancelledError:
        fields["action"] = fields["action"] or "cancelled"
        fields["error"] = "the runtime was stopped during the cycle"
        raise
    except Exception as exc:
        logger.exception("planner cycle %s failed", cycle.cycle_id)
        fields["action"] = fields["action"] or "error"
        fields["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        if not closed:
            # A cancelled runtime (shutdown, eviction) still leaves an honest record behind.
            try:
                await _close(cycle=cycle, fields=finalize())
            except Exception:
                logger.exception("could not record planner cycle %s", cycle.cycle_id)
    return CycleResult(cycle=cycle, action=fields["action"], mentioned=mentioned, llm_calls=llm_calls)
