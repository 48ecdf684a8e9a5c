"""The life loop: one turn per timer firing, run in a django-q2 worker.

A turn is ONE model call (not the chat planner) with the persona, the inner state, memory and the
current time, and the user message `[timer] <label>: <payload>`. The model answers with tool calls:
`send_message(text, session?)`, `update_inner_state(text)`, `do_nothing(reason)`. Text without a tool
call sends nothing. Every turn is a PlannerCycle(kind=life) with its ToolCallRecords and its LLMCall in
the ledger; a hard timeout (`life.turn_timeout`) bounds it. A timer whose payload starts with `say:`
sends the rest as written, without a model call (so it works offline too); with no model configured
any other timer's turn is recorded as skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.utils import timezone

from chat.models import ChatSession, CycleKind, LLMCall, PlannerCycle, SourceKind, ToolCallRecord
from chat.services import message_send
from maibot.config import format_instant, get_config
from scheduling.life.error_codes import LifeError, LifeToolErrorCode
from scheduling.life.memory import inner_state_text, inner_state_update, memory_block, summary_block
from scheduling.life.models import FiringStatus, Timer, TimerFiring, TimerStatus

logger = logging.getLogger(__name__)

Code = LifeToolErrorCode

LIFE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "send_message",
            "description": "Send a message to a chat: the timer's chat unless `session` names another (a session_id).",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "The message, as the person will read it."},
                    "session": {
                        "type": ["string", "null"],
                        "description": "session_id of another chat; omit for the timer's chat.",
                    },
                },
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "update_inner_state",
            "description": "Replace your inner state: your own note about your current situation, mood and plans.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The whole new inner state."}},
                "required": ["text"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "do_nothing",
            "description": "Decide that nothing needs doing now.",
            "parameters": {
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why, in a few words."}},
                "required": ["reason"],
                "additionalProperties": False,
            },
        },
    },
]
LIFE_TOOL_NAMES = {t["function"]["name"] for t in LIFE_TOOLS}


@dataclass
class TurnResult:
    outcome: str  # sent | updated | nothing | text_only | skipped | literal | timeout | error | ...
    sent_message_ids: list[int] = field(default_factory=list)
    error: str = ""


# --- the prompt -----------------------------------------------------------------------------------


def _describe_session(session: ChatSession | None) -> str:
    if session is None:
        return "This timer belongs to no chat: send_message needs a `session`."
    return f"This timer belongs to the chat {session} (session_id {session.session_id})."


def build_prompt(timer: Timer, now: datetime) -> list[dict[str, str]]:
    cfg = get_config()
    parts = [
        cfg.bot.persona,
        f"Your name is {cfg.bot.nickname}. This is your life loop: a timer you (or an operator) set has "
        "woken you. Decide with the tools: send a message, update your inner state, or do nothing. "
        "Only what you send with send_message reaches anyone.",
        f"Current time: {format_instant(now, cfg.tzinfo)} ({cfg.tzinfo}).",
        _describe_session(timer.session),
    ]
    if inner := inner_state_text():
        parts.append(f"## Your inner state (update_inner_state replaces it)\n{inner}")
    for block in (memory_block(timer.session), summary_block(timer.session)):
        if block:
            parts.append(block)
    user = f"[timer] {timer.label}: {timer.payload}" if timer.payload else f"[timer] {timer.label}"
    return [{"role": "system", "content": "\n\n".join(parts)}, {"role": "user", "content": user}]


# --- tool execution (sync, in a thread) -----------------------------------------------------------


def _err(code: LifeToolErrorCode, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": str(code), "message": message}}


def _send_message(timer: Timer, cycle: PlannerCycle, firing: TimerFiring, args: dict[str, Any]) -> dict[str, Any]:
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        return _err(Code.EMPTY_TEXT, "text is empty")
    limit = get_config().scheduling.max_text_length
    if len(text) > limit:
        return _err(Code.TEXT_TOO_LONG, f"text has {len(text)} characters; the limit is {limit}")
    target = args.get("session")
    if target is not None and not isinstance(target, str):
        return _err(Code.INVALID_ARGUMENT, "session must be a session_id string")
    if target:
        session = ChatSession.objects.filter(session_id=target.strip()).first()
        if session is None:
            return _err(Code.UNKNOWN_SESSION, f"no chat with session_id {target!r}")
    else:
        session = timer.session
        if session is None:
            return _err(Code.NO_SESSION, "this timer has no chat; give `session`")
    message = message_send(
        session=session,
        source_kind=SourceKind.TIMER,
        text=text.strip(),
        extra={"timer_id": timer.pk, "firing_id": firing.pk, "cycle_id": str(cycle.cycle_id)},
    )
    return {"ok": True, "message_id": str(message.uid), "session_id": session.session_id, "_pk": message.pk}


def _update_inner_state(cycle: PlannerCycle, tool_call_id: str, args: dict[str, Any]) -> dict[str, Any]:
    text = args.get("text")
    if not isinstance(text, str):
        return _err(Code.INVALID_ARGUMENT, "text must be a string")
    try:
        inner_state_update(text=text, via="life", cycle=cycle, tool_call_id=tool_call_id)
    except LifeError as exc:
        return _err(str(exc.code), exc.message)
    return {"ok": True}


def execute_tool_calls(timer: Timer, firing: TimerFiring, cycle: PlannerCycle, calls: list[Any]) -> TurnResult:
    """Run the model's tool calls; each is recorded, a bad one (unknown, malformed) as an error that
    does nothing."""
    result = TurnResult(outcome="text_only")
    outcomes: list[str] = []
    for call in calls:
        if call.name not in LIFE_TOOL_NAMES:
            res = _err(Code.UNKNOWN_TOOL, f"no tool {call.name!r}; use send_message, update_inner_state or do_nothing")
        elif call.arguments is None:
            res = _err(Code.INVALID_ARGUMENTS, f"arguments are not a JSON object: {call.argument_error}")
        elif call.name == "send_message":
            with transaction.atomic():
                res = _send_message(timer, cycle, firing, call.arguments)
            if res.get("ok"):
                result.sent_message_ids.append(res.pop("_pk"))
                outcomes.append("sent")
        elif call.name == "update_inner_state":
            res = _update_inner_state(cycle, call.id, call.arguments)
            if res.get("ok"):
                outcomes.append("updated")
        else:
            reason = call.arguments.get("reason", "")
            res = {"ok": True, "reason": str(reason)[:500]}
            outcomes.append("nothing")
        if not res.get("ok"):
            outcomes.append("error")
        ToolCallRecord.objects.create(
            cycle=cycle,
            tool_call_id=call.id,
            name=call.name[:128],
            arguments=call.arguments or {},
            raw_arguments=call.raw_arguments,
            result=res,
            ok=bool(res.get("ok")),
        )
    if outcomes:
        # The most telling outcome names the turn: a send beats an update beats nothing.
        for outcome in ("sent", "updated", "nothing", "error"):
            if outcome in outcomes:
                result.outcome = outcome
                break
    return result


# --- the turn -------------------------------------------------------------------------------------


def _start_cycle(timer: Timer, prompt: list[dict[str, str]], now: datetime) -> PlannerCycle:
    return PlannerCycle.objects.create(
        kind=CycleKind.LIFE,
        session=timer.session,
        started_at=now,
        trigger=f"timer {timer.pk}: {timer.label}"[:255],
        prompt=prompt,
    )


def _end_cycle(cycle: PlannerCycle, result: TurnResult, timings: dict[str, int], reasoning: str = "") -> None:
    cycle.ended_at = timezone.now()
    cycle.action = result.outcome
    cycle.outcome = json.dumps({"sent_message_ids": result.sent_message_ids}) if result.sent_message_ids else ""
    cycle.error = result.error
    cycle.reasoning = reasoning
    cycle.timings = timings
    cycle.save(update_fields=["ended_at", "action", "outcome", "error", "reasoning", "timings"])


def _literal_turn(timer: Timer, firing: TimerFiring, now: datetime) -> tuple[PlannerCycle, TurnResult]:
    """A `say:` payload goes out as written, with no model call; with no model configured, any other
    payload is skipped. Either way the turn is recorded."""
    text = timer.literal_text
    cycle = _start_cycle(timer, [], now)
    if text is None:
        result = TurnResult(outcome="skipped", error="no model configured and the payload is not a say: message")
    elif not text or timer.session is None:
        result = TurnResult(outcome="error", error="say: needs text and a timer bound to a chat")
    else:
        with transaction.atomic():
            message = message_send(
                session=timer.session,
                source_kind=SourceKind.TIMER,
                text=text,
                extra={"timer_id": timer.pk, "firing_id": firing.pk, "cycle_id": str(cycle.cycle_id)},
            )
        result = TurnResult(outcome="literal", sent_message_ids=[message.pk])
    _end_cycle(cycle, result, {})
    return cycle, result


async def _model_turn(timer: Timer, firing: TimerFiring, cycle: PlannerCycle) -> TurnResult:
    from chat.agent.llm import complete

    started = time.perf_counter()
    answer = await complete(
        purpose="life",
        messages=cycle.prompt,
        tools=LIFE_TOOLS,
        session_id=timer.session_id,
        cycle_id=cycle.pk,
        timeout=get_config().life.turn_timeout,
    )
    llm_ms = int((time.perf_counter() - started) * 1000)
    if not answer.ok:
        result = TurnResult(outcome="error", error=f"model call failed: {answer.error}")
    else:
        result = await sync_to_async(execute_tool_calls)(timer, firing, cycle, answer.tool_calls)
        errors = [c.name for c in answer.tool_calls if c.name not in LIFE_TOOL_NAMES or c.arguments is None]
        if errors and not result.error:
            result.error = f"bad tool calls: {', '.join(errors)}"
    await sync_to_async(_end_cycle)(cycle, result, {"llm_ms": llm_ms}, answer.content)
    return result


async def _run_turn(firing_id: int) -> TurnResult:
    now = timezone.now()

    def load() -> tuple[TimerFiring, Timer]:
        firing = TimerFiring.objects.select_related("timer__session").get(pk=firing_id)
        return firing, firing.timer

    firing, timer = await sync_to_async(load)()
    if timer.status == TimerStatus.CANCELLED:
        return TurnResult(outcome="skipped", error="the timer was cancelled before its turn ran")
    if timer.literal_text is not None or get_config().offline:
        cycle, result = await sync_to_async(_literal_turn)(timer, firing, now)
        await sync_to_async(_link_cycle)(firing_id, cycle)
        return result
    prompt = await sync_to_async(build_prompt)(timer, now)
    cycle = await sync_to_async(_start_cycle)(timer, prompt, now)
    await sync_to_async(_link_cycle)(firing_id, cycle)
    timeout = get_config().life.turn_timeout
    try:
        return await asyncio.wait_for(_model_turn(timer, firing, cycle), timeout=timeout)
    except TimeoutError:
        result = TurnResult(outcome="timeout", error=f"the turn took longer than {timeout:g}s")
        await sync_to_async(_record_timeout)(cycle, timer, timeout)
        await sync_to_async(_end_cycle)(cycle, result, {"timeout_s": int(timeout)})
        return result


def _record_timeout(cycle: PlannerCycle, timer: Timer, timeout: float) -> None:
    """A call cut off by the turn's timeout never reached the ledger from chat.agent.llm: put it there."""
    if not LLMCall.objects.filter(cycle=cycle).exists():
        LLMCall.objects.create(
            cycle=cycle,
            session=timer.session,
            purpose="life",
            model=get_config().llm_model,
            latency_ms=int(timeout * 1000),
            error=f"timeout: the life-loop turn was cut off after {timeout:g}s",
        )


def _link_cycle(firing_id: int, cycle: PlannerCycle) -> None:
    TimerFiring.objects.filter(pk=firing_id).update(cycle=cycle)


def run_firing(firing_id: int) -> str:
    """django-q2 task: run the life-loop turn of one firing, exactly once (the worker claims it)."""
    now = timezone.now()
    claimed = TimerFiring.objects.filter(pk=firing_id, status=FiringStatus.PENDING).update(
        status=FiringStatus.RUNNING, started_at=now
    )
    if not claimed:
        return "already taken"
    try:
        result = async_to_sync(_run_turn)(firing_id)
    except Exception as exc:
        logger.exception("life-loop turn of firing %s crashed", firing_id)
        result = TurnResult(outcome="error", error=f"{type(exc).__name__}: {exc}")
    status = {
        "skipped": FiringStatus.SKIPPED,
        "error": FiringStatus.FAILED,
        "timeout": FiringStatus.FAILED,
    }.get(result.outcome, FiringStatus.DONE)
    TimerFiring.objects.filter(pk=firing_id, status=FiringStatus.RUNNING).update(
        status=status, outcome=result.outcome, error=result.error[:2000], finished_at=timezone.now()
    )
    timer_id = TimerFiring.objects.filter(pk=firing_id).values_list("timer_id", flat=True).first()
    Timer.objects.filter(pk=timer_id).update(last_error=result.error[:2000] if status == FiringStatus.FAILED else "")
    logger.info("life-loop turn of firing %s: %s %s", firing_id, result.outcome, result.error)
    return result.outcome
