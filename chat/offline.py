"""The OFFLINE planner: it answers what registered commands understand, without a model.

It runs when no model is configured (`get_config().offline`), and when the planner's daily budget is
spent (chat.agent.budget: then its notice says when the model is back, and in groups it answers only
commands). Each typed text of the new messages is offered to the commands in chat.components
(scheduling registers the reminder commands: "remind me in 10 minutes…", "提醒我10分钟后喝水",
/schedule, /list, /cancel); the first that handles it answers. When none did, a fixed answer in the
bot's language (bot.language zh or en) says no model is configured, with what the commands can do. In
group chats it answers only commands and messages that mention the bot. Every answered turn is a
PlannerCycle (opened and closed by the agent-turn engine, chat.agent.engine) with action offline_* and
no LLM call; the commands' tool calls run and are recorded through it. Messages without text (images,
stickers, notices) get no answer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from chat import talk
from chat.agent import budget
from chat.agent.engine import AgentTurn, abandon_cycle
from chat.commands import CommandRun, typed_text
from chat.components import command_handle, commands
from chat.models import ChatSession, CycleKind, Message, PlannerCycle, SourceKind
from chat.services import message_send
from core.aio import db
from core.config import get_config

logger = logging.getLogger(__name__)

NOTICE = {
    "zh": ("（离线模式：还没有配置模型，", "我什么也做不了。）"),
    "en": ("(Offline mode: no model is configured, ", "so I cannot answer.)"),
}


BUDGET_NOTICE = {
    "zh": "（今天的模型额度用完了，{resets} 恢复。",
    "en": "(Today's model budget is used up; I am back at {resets}. ",
}


SORRY = {"zh": "抱歉，这条消息我没处理好。", "en": "Sorry, I could not handle that message."}


def _sorry() -> str:
    lang = get_config().bot.language.split("-")[0]
    return SORRY.get(lang, SORRY["en"])


def _notice(over_budget: str = "") -> str:
    cfg = get_config()
    lang = cfg.bot.language.split("-")[0]
    lang = lang if lang in NOTICE else "en"
    head, nothing = NOTICE[lang]
    if over_budget:
        resets = budget.resets_at(budget.local_day(budget.clock(), cfg.tzinfo), cfg.tzinfo)
        head = BUDGET_NOTICE[lang].format(resets=f"{resets:%H:%M}")
    helps = [c.help.get(lang) or c.help.get("en", "") for c in commands() if c.help]
    return head + (helps[0] if helps else nothing)


async def run_offline_cycle(
    *, session: ChatSession, new_messages: list[Message], mentioned: bool, over_budget: str = ""
) -> PlannerCycle | None:
    """Handle the new messages of one cycle; None when there was nothing to answer (group chatter).
    `over_budget`: a model is configured but its daily budget is spent (why): the notice says when it
    is back, and in groups only commands are answered. A plugin's command is awaited on this loop (no
    thread waits for its answer); everything that reads or writes the database runs in a thread."""
    started = time.perf_counter()
    typed = [(m, t) for m, t in ((m, typed_text(m)) for m in new_messages) if t]
    texts = [t for _, t in typed]
    slash = [t for t in texts if t.startswith("/")]
    if not texts:
        return None  # stickers, images, notices: nothing to read, nothing to answer
    if not session.is_private and not (mentioned or slash):
        return None
    if over_budget and not session.is_private and not slash:
        return None  # a group is not told about the budget: the bot stays silent there
    trigger = f"{len(new_messages)} new message(s), " + ("over budget" if over_budget else "offline")
    agent_turn = await _open(kind=CycleKind.CHAT, session=session, trigger=trigger)
    turn = CommandRun(agent_turn, call_prefix="offline")
    handlers = commands()
    handled_any = False
    try:
        for message, text in typed:
            if not talk.may_command(message, session):
                continue  # chat.command_operators: only they may use commands; others get the notice
            turn.message = message
            for command in handlers:
                try:
                    handled = await command_handle(command, turn, text)
                except Exception:
                    # Our bug, not the person's: they still get an answer, and the turn is recorded.
                    logger.exception("offline command %s failed on a message of session %s", command.name, session.pk)
                    turn.answer(_sorry(), "offline_error")
                    handled = True
                if handled:
                    handled_any = True
                    break
    except asyncio.CancelledError:
        await _abandon(cycle_id=agent_turn.cycle.cycle_id)
        raise
    return await _finish(session=session, turn=turn, handled_any=handled_any, over_budget=over_budget, started=started)


def _finish_turn(
    *, session: ChatSession, turn: CommandRun, handled_any: bool, over_budget: str, started: float
) -> PlannerCycle:
    """Send the turn's answers (the notice when no command answered) and close its record."""
    agent_turn = turn.turn
    cycle = agent_turn.cycle
    if not turn.replies and handled_any:
        # A command that answered by itself (a plugin's, through the send service): nothing to add.
        agent_turn.close(
            action="command",
            reasoning=f"offline planner ({over_budget or 'no model configured'})"[:4000],
            outcome="; ".join(turn.outcomes)[:4000] or "handled by a command",
            timings={"total_ms": round((time.perf_counter() - started) * 1000, 3)},
        )
        return cycle
    if not turn.replies:
        if over_budget and not session.is_private:
            agent_turn.close(action="offline_silent", reasoning=over_budget[:4000], outcome="stayed silent")
            return cycle
        turn.answer(_notice(over_budget), "offline_notice")
    for text in turn.replies:
        message_send(session=session, source_kind=SourceKind.REPLY, text=text, extra={"cycle_id": str(cycle.cycle_id)})
    agent_turn.close(
        action=turn.actions[0],
        reasoning=f"offline planner ({over_budget or 'no model configured'})"[:4000],
        outcome="; ".join(f"{a}: {r}" for a, r in zip(turn.actions, turn.replies, strict=False))[:4000],
        timings={"total_ms": round((time.perf_counter() - started) * 1000, 3)},
    )
    return cycle


_open = db(AgentTurn.open)
_abandon = db(abandon_cycle)
_finish = db(_finish_turn)
