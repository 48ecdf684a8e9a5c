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

from django.utils import timezone

from chat import events
from chat.agent import llm
from chat.agent.engine import AgentTurn, ToolOutcome, abandon_cycle, close_cycle
from chat.agent.prompt import prompt_manager
from chat.components import Tool, context_blocks
from chat.models import ChatSession, CycleKind, Message, PlannerCycle
from chat.planner.failure_reply import failure_reply_send
from chat.planner.history import HistoryCache, history_read, recent_cycles_read
from chat.planner.hooks import after_response, replies
from chat.planner.prompts import SYSTEM_PROMPT, TURN_PROMPT, chat_description, instruction
from chat.planner.rules import content_as_reply
from core.aio import db
from core.config import format_instant, get_config

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


_abandon = db(abandon_cycle)
_prepare = db(prepare)
_open = db(cycle_open)
_fallback = db(content_fallback)
_close = db(close_cycle)


class Stopwatch:
    """Milliseconds per phase: observe, prompt (open the record, read, render), plan (the model calls,
    of which llm_ms is the providers' own HTTP time), execute (tools), record (assembling the record;
    the one UPDATE that stores it is the only untimed step), total. `lap(phase)` adds the time since
    the previous lap (or the start) to `phase`."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._t0 = self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = round(self.timings.get(phase, 0.0) + (now - self._mark) * 1000, 3)
        self._mark = now

    def total(self) -> None:
        self.timings["total_ms"] = round((time.perf_counter() - self._t0) * 1000, 3)


@dataclass
class CycleRun:
    """One running cycle: its inputs, the conversation with the model so far, and what its record will
    say. The rounds add to it; `record()` turns it into the PlannerCycle's fields. `close_after` runs
    in the engine's thread while the cycle's coroutine waits for it (never concurrently with a step)."""

    turn: AgentTurn
    new_messages: list[Message]
    trigger: str
    mentioned: bool
    history_cache: HistoryCache | None
    has_news: Callable[[], bool]
    observe_more: Callable[[], Awaitable[list[Message]]]
    watch: Stopwatch
    prepared: Prepared | None = None
    conversation: list[dict[str, Any]] = field(default_factory=list)
    schemas: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, Any] = field(
        default_factory=lambda: {"action": "", "reasoning": "", "outcome": "", "error": "", "replanned": False}
    )
    reasoning: list[str] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    llm_calls: int = 0
    llm_ms: float = 0.0
    round_no: int = 0
    tools_ran: bool = False
    closed: bool = False  # the last round's trip to the database closed the record too
    done: RoundOutcome = field(default_factory=RoundOutcome)

    def end(self, action: str, error: str) -> None:
        self.fields["action"] = action
        self.fields["error"] = error

    def take(self, done: RoundOutcome) -> None:
        """A round's reasoning, outcome lines and tool results."""
        self.reasoning.extend(r for r in done.reasoning if r)
        self.outcome.extend(done.outcome)
        self.conversation.extend(done.tool_messages)

    def record(self) -> dict[str, Any]:
        """The record's fields, the record phase and the total timed last."""
        self.watch.timings["llm_ms"] = round(self.llm_ms, 3)
        self.fields["reasoning"] = "\n".join(r for r in self.reasoning if r)[:4000]
        self.fields["outcome"] = "; ".join(o for o in self.outcome if o)[:4000]
        self.fields["prompt"] = self.conversation
        self.watch.lap("record_ms")
        self.watch.total()
        self.fields["timings"] = self.watch.timings
        return self.fields

    def close_after(self, outcomes: list[ToolOutcome]) -> dict[str, Any] | None:
        """The engine's `close`: when the round ends the cycle, its results and the cycle's record go to
        the database in one trip (the record's fields, returned here); else None."""
        self.done = round_outcome(outcomes)
        if not self.done.ended:
            return None
        self.watch.lap("execute_ms")
        self.take(self.done)
        self.fields["action"] = self.done.action
        return self.record()


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
    `observe_more()` fetches them (for the one replan). The cycle is recorded however it ends (a
    failure as `error`, a cancellation as `cancelled`, then re-raised)."""
    max_rounds = get_config().chat.max_rounds
    watch = Stopwatch()
    watch.timings["observe_ms"] = round(observe_ms, 3)
    turn, prepared = await _open_cycle(
        session=session, trigger=trigger, new_messages=new_messages, mentioned=mentioned, history_cache=history_cache
    )
    run = CycleRun(
        turn=turn,
        new_messages=new_messages,
        trigger=trigger,
        mentioned=mentioned,
        history_cache=history_cache,
        has_news=has_news,
        observe_more=observe_more,
        watch=watch,
    )
    try:
        if isinstance(prepared, Exception):
            raise prepared
        await _request(run, prepared)
        await _rounds(run, max_rounds)
    except asyncio.CancelledError:
        run.end(run.fields["action"] or "cancelled", "the runtime was stopped during the cycle")
        raise
    except Exception as exc:
        logger.exception("planner cycle %s failed", turn.cycle.cycle_id)
        run.end(run.fields["action"] or "error", f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        if not run.closed:
            await _record(run)
    return CycleResult(cycle=turn.cycle, action=run.fields["action"], mentioned=mentioned, llm_calls=run.llm_calls)


async def _open_cycle(**kwargs: Any) -> tuple[AgentTurn, Prepared | Exception]:
    """Open the record and prepare the prompt (cycle_open); stopped meanwhile, close it if it was written."""
    cycle_id = uuid.uuid4()
    try:
        return await _open(started_at=timezone.now(), cycle_id=cycle_id, **kwargs)
    except asyncio.CancelledError:
        await _abandon(cycle_id=cycle_id)
        raise


async def _request(run: CycleRun, prepared: Prepared) -> None:
    """The request the next round sends: the prepared prompt and tools, through the before_request point."""
    run.prepared = prepared
    run.conversation, run.schemas = await _before_request(
        run.turn.session, list(prepared.messages), run.turn.schemas(prepared.tools)
    )
    run.watch.lap("prompt_ms")


async def _rounds(run: CycleRun, max_rounds: int) -> None:
    """Ask the model and run its tools until an ending action, an error, plain text, or max_rounds calls."""
    while run.round_no < max_rounds:
        result = await _plan(run)
        if await _replanned(run, result):
            continue
        result, dropped = await after_response(run.turn.session, result, len(run.conversation))
        if dropped:
            run.end("no_reply", "")
            run.outcome.append("maisaka.planner.after_response handlers removed every tool call; stayed silent")
            return
        result = await replies(run.turn.session, result, run.round_no + 1)
        if await _ended_without_tools(run, result) or await _execute(run, result):
            return
        run.round_no += 1
    run.end("max_rounds", f"the model did not end its turn within {max_rounds} calls")


async def _plan(run: CycleRun) -> llm.LLMResult:
    result = await llm.complete(
        purpose="planner",
        messages=run.conversation,
        tools=run.schemas,
        session_id=run.turn.session.pk,
        cycle_id=run.turn.cycle.pk,
    )
    run.llm_calls += 1
    run.llm_ms += result.latency_ms
    run.watch.lap("plan_ms")
    return result


async def _replanned(run: CycleRun, result: llm.LLMResult) -> bool:
    """Stale: someone spoke while the model was thinking, before any tool ran. Discard the answer and
    ask again, once, with them (True when it did)."""
    if run.tools_ran or run.fields["replanned"] or not run.has_news():
        return False
    more = await run.observe_more()
    if not more:
        return False
    run.new_messages = [*run.new_messages, *more]
    run.fields["replanned"] = True
    stale = ", ".join(c.name for c in result.tool_calls) or result.error or "text"
    run.outcome.append(f"discarded a stale plan ({stale}) for {len(more)} new message(s)")
    prepared = await _prepare(
        turn=run.turn,
        new_messages=run.new_messages,
        trigger=run.trigger,
        mentioned=run.mentioned,
        history_cache=run.history_cache,
    )
    await _request(run, prepared)
    run.round_no += 1
    return True


async def _ended_without_tools(run: CycleRun, result: llm.LLMResult) -> bool:
    """An answer with no tool call ends the cycle: a failed call, or plain text (sent as the reply
    only when it reads as one, see content_fallback)."""
    if not result.ok:
        # A daily cap reached mid-cycle (another process spent the rest): no call was made.
        run.end("over_budget" if result.budget_exceeded else "error", result.error)
        if not result.budget_exceeded:
            told = await db(failure_reply_send)(session=run.turn.session, cycle=run.turn.cycle)
            if told is not None:
                run.outcome.append(f"the model failed; told the user: {told.text}"[:500])
        return True
    if result.content and result.tool_calls:
        run.reasoning.append(result.content.strip())
    if result.tool_calls:
        return False
    action = await _fallback(turn=run.turn, content=result.content, round_no=run.round_no)
    run.fields["action"] = action
    if action == "reply":
        run.reasoning.append("answered in plain text; sent as the reply")
        run.outcome.append(f"said: {result.content.strip()}"[:500])
    else:
        run.outcome.append(f"plain text not sent: {result.content.strip()[:300]}" if result.content else "")
    run.watch.lap("execute_ms")
    return True


async def _execute(run: CycleRun, result: llm.LLMResult) -> bool:
    """Run the answer's tool calls (recorded); True when they ended the cycle, whose record then went
    to the database in the same trip."""
    run.conversation.append(result.assistant_message or {"role": "assistant", "content": result.content})
    # Plugins' and MCP servers' tools are awaited here: a slow one holds no thread other chats need.
    await run.turn.aexecute(result.tool_calls, round_no=run.round_no, tools=run.prepared.tools, close=run.close_after)
    run.tools_ran = True
    if run.done.ended:
        run.closed = True
        return True
    run.watch.lap("execute_ms")
    run.take(run.done)
    return False


async def _record(run: CycleRun) -> None:
    """Close the record of a cycle no round closed: a cancelled runtime (shutdown, eviction) still
    leaves an honest record behind."""
    try:
        await _close(cycle=run.turn.cycle, fields=run.record())
    except Exception:
        logger.exception("could not record planner cycle %s", run.turn.cycle.cycle_id)
