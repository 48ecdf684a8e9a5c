"""The life loop: one turn per timer firing, run in a django-q2 worker (sync, start to end).

A turn is ONE model call (not the chat planner) with the persona, the inner state, memory and the
current time (the registered prompt "life.system", chat.agent.prompt), and the user message
`[timer] <label>: <payload>`. It runs on the agent-turn engine (chat.agent.engine) with the tools of
scope "life" (scheduling/life/loop_tools.py): `send_message(text, session?)`,
`update_inner_state(text)`, `do_nothing(reason)`. Text without a tool call sends nothing. Every turn
is a PlannerCycle(kind=life) with its ToolCallRecords and its LLMCall in the ledger. `life.turn_timeout`
bounds the model call (the sync client's timeout, without retries); a call cut off is in the ledger
with its error and the turn is recorded as a timeout. Each tool call has its own timeout
(`chat.tool_timeout`). A timer whose payload starts with `say:` sends the rest as written, without a
model call (so it works offline too); with no model configured, or a daily budget of the life task
(or the chat) reached (chat.agent.budget), any other timer's turn is recorded as skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from chat.agent import budget
from chat.agent.engine import AgentTurn, ToolOutcome
from chat.agent.llm import complete_sync
from chat.agent.prompt import prompt_manager
from chat.components import LIFE
from chat.components import ToolErrorCode as EngineCode
from chat.models import ChatSession, CycleKind, PlannerCycle, SourceKind
from chat.services import message_send
from core.config import format_instant, get_config
from scheduling.life.memory import inner_state_text, memory_block, summary_block
from scheduling.life.models import FiringStatus, Timer, TimerFiring, TimerStatus
from scheduling.mcp.client import life_clients

logger = logging.getLogger(__name__)


@dataclass
class TurnResult:
    outcome: str  # sent | updated | tool | nothing | text_only | skipped | literal | timeout | error | ...
    sent_message_ids: list[int] = field(default_factory=list)
    error: str = ""


# --- the prompt -----------------------------------------------------------------------------------

SYSTEM_PROMPT = "life.system"
TIMER_PROMPT = "life.timer"

LIFE_SITUATION = (
    "Your name is {nickname}. This is your life loop: a timer you (or an operator) set has woken you. "
    "Decide with the tools: send a message, update your inner state, or do nothing. Only what you send "
    "with send_message reaches anyone."
)


def _describe_session(session: ChatSession | None) -> str:
    if session is None:
        return "This timer belongs to no chat: send_message needs a `session`."
    return f"This timer belongs to the chat {session} (session_id {session.session_id})."


def _inner_state(context) -> str:
    inner = inner_state_text()
    return f"## Your inner state (update_inner_state replaces it)\n{inner}" if inner else ""


prompt_manager.add_system_prompt(
    SYSTEM_PROMPT,
    [
        ("persona", "{persona}"),
        ("situation", LIFE_SITUATION),
        ("now", "Current time: {now} ({tz})."),
        ("chat", "{chat}"),
        ("inner_state", "{inner_state}"),
        ("memory", "{memory}"),
        ("summary", "{summary}"),
    ],
    construct={
        "chat": lambda c: _describe_session(c["session"]),
        "inner_state": _inner_state,
        "memory": lambda c: memory_block(c["session"]),
        "summary": lambda c: summary_block(c["session"]),
    },
)
prompt_manager.add_system_prompt(
    TIMER_PROMPT,
    [("timer", "[timer] {label}{payload_part}")],
    construct={"payload_part": lambda c: f": {c['payload']}" if c["payload"] else ""},
)


def build_prompt(timer: Timer, now: datetime) -> list[dict[str, str]]:
    cfg = get_config()
    system = prompt_manager.get_prompt(SYSTEM_PROMPT).render(
        persona=cfg.bot.persona,
        nickname=cfg.bot.nickname,
        now=format_instant(now, cfg.tzinfo),
        tz=cfg.tzinfo,
        session=timer.session,
    )
    user = prompt_manager.get_prompt(TIMER_PROMPT).render(label=timer.label, payload=timer.payload)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# --- the turn -------------------------------------------------------------------------------------

# Called before every model turn, in the worker running it, to make the turn's tools ready: the apps
# above register theirs from AppConfig.ready (plugins: start this worker's plugin host on first use).
# One that raises is logged; the turn goes on without what it would have added.
_turn_setups: dict[str, Callable[[], object]] = {}


def add_turn_setup(name: str, setup: Callable[[], object]) -> None:
    _turn_setups[name] = setup


# The most telling outcome names the turn: a send beats an update beats another tool (a plugin's, an MCP
# server's) beats nothing beats an error.
_OUTCOME_OF_TOOL = {"send_message": "sent", "update_inner_state": "updated", "do_nothing": "nothing"}
_RANKED_OUTCOMES = ("sent", "updated", "tool", "nothing", "error")
_BAD_CALL = {EngineCode.UNKNOWN_TOOL, EngineCode.INVALID_ARGUMENTS}


def turn_result(outcomes: list[ToolOutcome], sent_message_ids: list[int]) -> TurnResult:
    seen = {(_OUTCOME_OF_TOOL.get(o.name, "tool") if o.ok else "error") for o in outcomes}
    result = TurnResult(
        outcome=next((o for o in _RANKED_OUTCOMES if o in seen), "text_only"), sent_message_ids=sent_message_ids
    )
    if bad := [o.name for o in outcomes if not o.ok and o.code in _BAD_CALL]:
        result.error = f"bad tool calls: {', '.join(bad)}"
    return result


def _open(timer: Timer, firing: TimerFiring, now: datetime, prompt: list[dict[str, str]]) -> AgentTurn:
    turn = AgentTurn.open(
        kind=CycleKind.LIFE,
        session=timer.session,
        trigger=f"timer {timer.pk}: {timer.label}",
        started_at=now,
        prompt=prompt,
        scope=LIFE,
        extra={"timer": timer, "firing": firing},
    )
    TimerFiring.objects.filter(pk=firing.pk).update(cycle=turn.cycle)
    return turn


def _close(turn: AgentTurn, result: TurnResult, timings: dict[str, int], reasoning: str = "") -> None:
    turn.close(
        action=result.outcome,
        outcome=json.dumps({"sent_message_ids": result.sent_message_ids}) if result.sent_message_ids else "",
        error=result.error,
        reasoning=reasoning,
        timings=timings,
    )


def _literal_turn(
    timer: Timer, firing: TimerFiring, now: datetime, *, why_no_model: str = ""
) -> tuple[PlannerCycle, TurnResult]:
    """A `say:` payload goes out as written, with no model call; with no model configured (or a daily
    budget reached: `why_no_model`), any other payload is skipped. Either way the turn is recorded."""
    text = timer.literal_text
    turn = _open(timer, firing, now, [])
    if text is None:
        why = why_no_model or "no model configured"
        result = TurnResult(outcome="skipped", error=f"{why}, and the payload is not a say: message")
    elif not text or timer.session is None:
        result = TurnResult(outcome="error", error="say: needs text and a timer bound to a chat")
    else:
        with transaction.atomic():
            message = message_send(
                session=timer.session,
                source_kind=SourceKind.TIMER,
                text=text,
                extra={"timer_id": timer.pk, "firing_id": firing.pk, "cycle_id": str(turn.cycle.cycle_id)},
            )
        result = TurnResult(outcome="literal", sent_message_ids=[message.pk])
    _close(turn, result, {})
    return turn.cycle, result


def _model_turn(timer: Timer, firing: TimerFiring, now: datetime) -> TurnResult:
    try:
        # The MCP servers offered to the life loop: connected in this worker on first use.
        life_clients.ensure()
    except Exception:
        logger.exception("the life loop's MCP servers could not be started; the turn goes on without them")
    for name, setup in list(_turn_setups.items()):
        try:
            setup()
        except Exception:
            logger.exception("life-loop set-up %s failed; the turn goes on without it", name)
    turn = _open(timer, firing, now, build_prompt(timer, now))
    timeout = get_config().life.turn_timeout
    started = time.perf_counter()
    answer = complete_sync(
        purpose="life",
        messages=turn.cycle.prompt,
        tools=turn.schemas(),
        session_id=timer.session_id,
        cycle_id=turn.cycle.pk,
        timeout=timeout,
        hard_timeout=True,
    )
    llm_ms = int((time.perf_counter() - started) * 1000)
    if answer.budget_exceeded:  # reached meanwhile (another process spent the rest): no call was made
        result = TurnResult(outcome="skipped", error=answer.budget_exceeded)
        _close(turn, result, {"llm_ms": llm_ms})
        return result
    if answer.timed_out:
        result = TurnResult(outcome="timeout", error=f"the turn took longer than {timeout:g}s")
        _close(turn, result, {"timeout_s": int(timeout)})
        return result
    if not answer.ok:
        result = TurnResult(outcome="error", error=f"model call failed: {answer.error}")
    else:
        outcomes = turn.execute(answer.tool_calls)
        result = turn_result(outcomes, turn.extra.get("sent_message_ids", []))
    _close(turn, result, {"llm_ms": llm_ms}, answer.content)
    return result


def _run_turn(firing_id: int) -> TurnResult:
    now = timezone.now()
    firing = TimerFiring.objects.select_related("timer__session").get(pk=firing_id)
    timer = firing.timer
    if timer.status == TimerStatus.CANCELLED:
        return TurnResult(outcome="skipped", error="the timer was cancelled before its turn ran")
    cfg = get_config()
    if timer.literal_text is not None or cfg.offline:
        return _literal_turn(timer, firing, now)[1]
    if cfg.llm.budgets and (reason := budget.blocked(task="life", session_id=timer.session_id, cfg=cfg)):
        return _literal_turn(timer, firing, now, why_no_model=reason)[1]
    return _model_turn(timer, firing, now)


def run_firing(firing_id: int) -> str:
    """django-q2 task: run the life-loop turn of one firing, exactly once (the worker claims it)."""
    now = timezone.now()
    claimed = TimerFiring.objects.filter(pk=firing_id, status=FiringStatus.PENDING).update(
        status=FiringStatus.RUNNING, started_at=now
    )
    if not claimed:
        return "already taken"
    try:
        result = _run_turn(firing_id)
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
