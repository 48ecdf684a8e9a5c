"""Commands before the chat planner, and the command turn they share with the offline planner.

The registered commands marked `before_planner` (plugins' commands) read each new message's typed
text first; a message one of them handles never reaches the model (and costs no model call). A turn
that ran a command is a PlannerCycle with action `command` (`command_passed` when none handled its
message), its tool calls and answers recorded as in the offline planner; messages no command wants
open no turn. Only people who may use commands (chat.talk.may_command) are offered to them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from chat import talk
from chat.agent.engine import AgentTurn, abandon_cycle
from chat.components import Command, command_handle, commands
from chat.models import ChatSession, CycleKind, Message, PlannerCycle, SourceKind
from chat.services import message_send
from core.aio import db

logger = logging.getLogger(__name__)


class CommandRun:
    """A chat.components.CommandTurn over an agent turn (the offline planner's, or the one before the
    planner): the commands' tool calls run through the agent-turn engine and are recorded on its
    cycle; their answers and notes are collected here for the caller to send and record."""

    def __init__(self, turn: AgentTurn, *, call_prefix: str) -> None:
        self.turn = turn
        self.session = turn.session
        self.message: Message | None = None
        self.replies: list[str] = []
        self.actions: list[str] = []  # one per reply
        self.outcomes: list[str] = []  # answers ("action: text") and notes, in order
        self._call_prefix = call_prefix

    def answer(self, text: str, action: str) -> None:
        self.replies.append(text)
        self.actions.append(action)
        self.outcomes.append(f"{action}: {text}")

    def note(self, outcome: str) -> None:
        self.outcomes.append(outcome)

    def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        return self.turn.call(name, arguments, call_id=f"{self._call_prefix}_{uuid.uuid4().hex[:16]}")


def typed_text(message: Message) -> str:
    """What the person typed: the text segments only (an image's "[image]" placeholder is not)."""

    def walk(segments) -> str:
        out = []
        for seg in segments or []:
            if seg.get("type") == "text" and isinstance(seg.get("data"), str):
                out.append(seg["data"])
            elif seg.get("type") == "seglist" and isinstance(seg.get("data"), list):
                out.append(walk(seg["data"]))
        return "".join(out)

    return walk(message.segments).strip()


def planner_commands() -> list[Command]:
    return [c for c in commands() if c.before_planner]


async def run_commands(*, session: ChatSession, new_messages: list[Message]) -> tuple[set[int], PlannerCycle | None]:
    """Offer each new message's text to the before-planner commands; returns the primary keys of the
    messages a command handled (the planner must not see them) and the turn's cycle (None: no command
    matched anything). A plugin's command is awaited on this loop (no thread waits for its answer);
    the turn's record and answers are written in a thread."""
    handlers = planner_commands()
    if not handlers:
        return set(), None
    started = time.perf_counter()
    handled: set[int] = set()
    turn: CommandRun | None = None
    try:
        for message in new_messages:
            text = typed_text(message)
            if not text or not talk.may_command(message, session):
                continue
            for command in handlers:
                if command.matches is not None and not command.matches(text):
                    continue
                if turn is None:
                    agent_turn = await _open(kind=CycleKind.CHAT, session=session, trigger="command")
                    turn = CommandRun(agent_turn, call_prefix="command")
                turn.message = message
                try:
                    done = await command_handle(command, turn, text)
                except Exception:
                    logger.exception("command %s failed on message %s", command.name, message.pk)
                    turn.note(f"{command.name} failed")
                    done = False
                if done:
                    handled.add(message.pk)
                    break
    except asyncio.CancelledError:
        if turn is not None:
            await _abandon(cycle_id=turn.turn.cycle.cycle_id)
        raise
    if turn is None:
        return handled, None
    await _finish(session=session, turn=turn, handled=handled, started=started)
    return handled, turn.turn.cycle


def _finish_turn(*, session: ChatSession, turn: CommandRun, handled: set[int], started: float) -> None:
    """Send the commands' answers and close the turn's record."""
    agent_turn = turn.turn
    for text in turn.replies:
        message_send(
            session=session, source_kind=SourceKind.REPLY, text=text, extra={"cycle_id": str(agent_turn.cycle.cycle_id)}
        )
    agent_turn.close(
        action="command" if handled else "command_passed",
        reasoning=f"{len(handled)} message(s) handled by a command before the planner",
        outcome="; ".join(turn.outcomes)[:4000],
        timings={"total_ms": round((time.perf_counter() - started) * 1000, 3)},
    )


_open = db(AgentTurn.open)
_abandon = db(abandon_cycle)
_finish = db(_finish_turn)
