"""One chat-planner cycle (`run_cycle`): open it, prepare its prompt, call the model, run the tools
through the agent-turn engine (chat.agent.engine, scope "chat") until an ending action, record it."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from chat import events
from chat.agent import llm
from chat.agent.engine import AgentTurn, ToolOutcome, abandon_cycle, close_cycle
from chat.agent.prompt import prompt_manager
from chat.components import Tool, context_blocks
from chat.models import ChatSession, CycleKind, Message, PlannerCycle
from chat.planner.history import HistoryCache, history_read, recent_cycles_read
from chat.planner.prompts import SYSTEM_PROMPT, TURN_PROMPT, chat_description, instruction
from chat.planner.rules import content_as_reply
from maibot.config import format_instant, get_config

logger = logging.getLogger(__name__)

ENDING_ACTIONS = ("reply", "send_emoji", "no_reply")


@dataclass
class CycleResult:
    cycle: PlannerCycle
    action: str
    mentioned: bool = False
    llm_calls: int = 0


@dataclass
class Prepared:
    messages: list[dict[str, Any]]
    tools: list[Tool]


@dataclass
class RoundOutcome:
    ended: bool = False
    action: str = ""
    reasoning: list[str] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    tool_messages: list[dict[str, Any]] = field(default_factory=list)


def prepare(
    *,
    turn: AgentTurn,
    new_messages: list[Message],
    trigger: str,
    mentioned: bool,
    history_cache: HistoryCache | None = None,
) -> Prepared:
    """Read what the prompt needs and render it (sync: run it in a thread)."""
    session, cycle = turn.session, turn.cycle
    cfg = get_config()
    tz = cfg.tzinfo
    window = cfg.chat.history_window
    history = history_cache.refresh(session, window) if history_cache else history_read(session, window)
    if history_cache:
        cycles = history_cache.recent_cycles(session, cfg.chat.cycle_records, exclude_pk=cycle.pk)
    else:
        cycles = recent_cycles_read(session, cfg.chat.cycle_records, exclude_pk=cycle.pk)
    tools = turn.tools()
    now = timezone.now()
    system = prompt_manager.get_prompt(SYSTEM_PROMPT).render(
        persona=cfg.bot.persona,
        nickname=cfg.bot.nickname,
        alias_names=[n for n in cfg.bot.alias_names if n != cfg.bot.nickname],
        chat_description=chat_description(session),
        private=session.is_private,
    )
    turn_text = prompt_manager.get_prompt(TURN_PROMPT).render(
        cfg=cfg,
        tz=tz,
        blocks=context_blocks(session),
        cycles=cycles,
        history=history,
        new_ids={m.pk for m in new_messages},
        rendered=history_cache.rendered(cfg) if history_cache else None,
        now=f"{format_instant(now, tz)} ({now.astimezone(tz):%A}, time zone {tz.key})",
        instruction=instruction(trigger, private=session.is_private, mentioned=mentioned),
    )
    return Prepared(
        messages=[{"role": "system", "content": system}, {"role": "user", "content": turn_text}],
        tools=tools,
    )


def cycle_open(
    *,
    session: ChatSession,
    trigger: str,
    started_at,
    new_messages: list[Message],
    mentioned: bool,
    history_cache: HistoryCache | None = None,
    cycle_id: uuid.UUID | None = None,
) -> tuple[AgentTurn, Prepared | Exception]:
    """Open the cycle's record and prepare its prompt, in one trip to a thread."""
    turn = AgentTurn.open(
        kind=CycleKind.CHAT, session=session, trigger=trigger, started_at=started_at, cycle_id=cycle_id
    )
    try:
        return turn, prepare(
            turn=turn, new_messages=new_messages, trigger=trigger, mentioned=mentioned, history_cache=history_cache
        )
    except Exception as exc:  # recorded on the cycle by the caller
        logger.exception("preparing planner cycle %s failed", turn.cycle.cycle_id)
        return turn, exc


def _rank(action: str) -> int:
    return ENDING_ACTIONS.index(action) if action in ENDING_ACTIONS else len(ENDING_ACTIONS)


def round_outcome(outcomes: list[ToolOutcome]) -> RoundOutcome:
    """What one answer's executed calls mean for the cycle: did it end, with which action, and the
    reasoning and outcome lines for its record."""
    out = RoundOutcome()
    for o in outcomes:
        out.tool_messages.append(o.message())
        if o.ok and o.tool is not None and o.tool.ends_cycle:
            out.ended = True
            # reply outranks send_emoji outranks no_reply (outranks other ending tools) as the action.
            if not out.action or _rank(o.name) < _rank(out.action):
                out.action = o.name
            if o.name == "reply":
                out.outcome.append(f"said: {o.arguments.get('text', '')}"[:500])
            elif o.name == "send_emoji":
                out.outcome.append(f"sent emoji: {o.result.get('emoji', '')}")
            elif o.name == "no_reply":
                out.reasoning.append(str(o.arguments.get("reason", "")))
                out.outcome.append("stayed silent")
        elif not o.ok:
            out.outcome.append(f"{o.name} failed: {o.code}")
        else:
            out.outcome.append(f"{o.name} ok")
    return out


def content_fallback(*, turn: AgentTurn, content: str, round_no: int) -> str:
    """Plain text instead of a tool call: send it as the reply (private, sane) or not at all."""
    text = content_as_reply(content) if turn.session.is_private else None
    if text is None:
        return "no_reply"
    res = turn.call("reply", {"text": text}, round_no=round_no, recorded_arguments={"text": text, "from_content": True})
    return "reply" if res.get("ok") else "no_reply"


_abandon = sync_to_async(abandon_cycle)
_prepare = sync_to_async(prepare)
_open = sync_to_async(cycle_open)
_fallback = sync_to_async(content_fallback)
_close = sync_to_async(close_cycle)


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


async def _before_request(
    session: ChatSession, messages: list[dict[str, Any]], schemas: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The `maisaka.planner.before_request` point: handlers may change the request's messages and tool
    definitions (free when nobody listens)."""
    emission = await events.aemit(
        events.Point.PLANNER_BEFORE_REQUEST, session=session, messages=messages, tool_definitions=schemas
    )
    return emission.kwargs["messages"], emission.kwargs["tool_definitions"]


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
        turn, prepared = await _open(
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
    cycle = turn.cycle
    fields: dict[str, Any] = {"action": "", "reasoning": "", "outcome": "", "error": "", "replanned": False}
    reasoning: list[str] = []
    outcome: list[str] = []
    llm_calls = 0
    llm_ms = 0.0
    conversation: list[dict[str, Any]] = []
    closed = False
    done = RoundOutcome()

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

    def close_after(outcomes: list[ToolOutcome]) -> dict[str, Any] | None:
        # Runs in the thread that records the round while this coroutine waits: when the round ends
        # the cycle, its results and the cycle's record go to the database in one trip.
        nonlocal t, done
        done = round_outcome(outcomes)
        if not done.ended:
            return None
        t = watch.add("execute_ms", t)
        reasoning.extend(r for r in done.reasoning if r)
        outcome.extend(done.outcome)
        conversation.extend(done.tool_messages)
        fields["action"] = done.action
        return finalize()

    try:
        if isinstance(prepared, Exception):
            raise prepared
        conversation, schemas = await _before_request(session, list(prepared.messages), turn.schemas(prepared.tools))
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
                        turn=turn,
                        new_messages=new_messages,
                        trigger=trigger,
                        mentioned=mentioned,
                        history_cache=history_cache,
                    )
                    conversation, schemas = await _before_request(
                        session, list(prepared.messages), turn.schemas(prepared.tools)
                    )
                    t = watch.add("prompt_ms", t)
                    round_no += 1
                    continue
            if not result.ok:
                # A daily cap reached mid-cycle (another process spent the rest): no call was made.
                fields["action"] = "over_budget" if result.budget_exceeded else "error"
                fields["error"] = result.error
                break
            if result.content and result.tool_calls:
                reasoning.append(result.content.strip())
            if not result.tool_calls:
                action = await _fallback(turn=turn, content=result.content, round_no=round_no)
                fields["action"] = action
                if action == "reply":
                    reasoning.append("answered in plain text; sent as the reply")
                    outcome.append(f"said: {result.content.strip()}"[:500])
                else:
                    outcome.append(f"plain text not sent: {result.content.strip()[:300]}" if result.content else "")
                t = watch.add("execute_ms", t)
                break
            conversation.append(result.assistant_message or {"role": "assistant", "content": result.content})
            # Plugins' and MCP servers' tools are awaited here: a slow one holds no thread other chats need.
            await turn.aexecute(result.tool_calls, round_no=round_no, tools=prepared.tools, close=close_after)
            tools_ran = True
            if done.ended:
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
