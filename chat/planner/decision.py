"""Should the bot speak now? The pure decision a session's runtime makes each time it looks at its news.

`decide(observed, session, state, config)` reads only its arguments: no database, no clock, no event
loop. The runtime gathers the facts (`Observed`), asks, and does what the `Decision` says:

* `skip`: nothing to do (no new message, or group chatter below the bar, see below);
* `offline`: the offline planner answers (chat/offline.py): no model is configured, or the planner's
  daily budget is spent (`over_budget` says why);
* `commands`: the before-planner commands (chat/commands.py) read the messages first; the runtime
  drops what they handled from `messages`, sets `commands_ran` and asks again;
* `ask_budget`: the answer depends on the daily budget (chat.agent.budget, one read); the runtime sets
  `over_budget` and asks again;
* `cycle`: one planner cycle with the model (chat/planner/cycle.py), with `trigger` and `mentioned`.

Each ask comes at most once per look (its answer is then in `Observed`), so a look ends after at most
three decisions. `Decision.state` is the group-chat restraint to keep (the runtime stores it whatever
the step), and `after_cycle()` gives the state after a cycle's action.

When does the bot speak?
* A wake for news ("message") with nothing plannable is skipped. Another reason (a plugin's
  "proactive" request, the "no_reply_timeout" look) runs even when nothing new was said.
* News settles first: a burst ends after `chat.debounce_seconds` of quiet (`debounce()`), a
  never-ending stream is looked at after 5x that all the same; then one look takes all of it.
* Private chats: every new message is considered (one look per debounced burst).
* Group chats: a new message *mentions* the bot when its text contains the nickname or one of
  `bot.alias_names` (case-insensitive), when it has an `@<name:id>` mention whose name is one of
  those or whose id is the bot's own account on the platform (`bot.platform_accounts`, else the one
  the adapter named in a receiver_info; see chat.accounts: a QQ mention arrives as
  `@<QQ nickname:QQ id>`, whatever the bot's nickname in our config), when it quotes one of the
  bot's own messages, or when an adapter plugin's gateway said it addresses the bot (`is_mentioned`).
  A mention always starts a cycle.
  Otherwise the model is asked only once enough unaddressed messages have piled up:
      backlog >= ceil(1 / talk_frequency) * 2 ** min(silent_streak, 4)
  where talk_frequency is the one in force for the chat now (chat/talk.py), backlog counts
  unaddressed messages since the bot last planned, and silent_streak counts the consecutive
  unaddressed cycles that ended in no_reply (reset by a reply or a mention). With talk_frequency 0
  the bot speaks only when mentioned. Messages below the bar cost no LLM call; they stay in the
  history the next cycle sees.
* Offline mode and a spent budget come before the commands and the bar: the offline planner has its
  own rules for groups (commands and mentions only).
* After an LLM-planned `no_reply` to news in a private chat the runtime looks once more after
  `chat.no_reply_timeout` seconds (trigger "no_reply_timeout"); that look never asks for another,
  so a silent chat costs at most one extra call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime

from chat import talk
from chat.models import ChatSession, Message
from chat.planner.rules import group_bar, mentions_bot
from core.config import BotConfig

# The wake reason of news: new messages were stored. Any other reason is a request for a turn.
NEWS = "message"
NO_REPLY_TIMEOUT = "no_reply_timeout"
SPOKE = ("reply", "send_emoji")
# A never-ending stream of news is looked at after this many debounce periods all the same.
MAX_DEBOUNCE_PERIODS = 5


class Step(enum.StrEnum):
    SKIP = "skip"
    ASK_BUDGET = "ask_budget"
    OFFLINE = "offline"
    COMMANDS = "commands"
    CYCLE = "cycle"


@dataclass(frozen=True, slots=True)
class TalkState:
    """Group-chat restraint kept between looks: unaddressed messages since the last cycle, and the
    consecutive unaddressed cycles that ended silent."""

    backlog: int = 0
    silent_streak: int = 0


@dataclass(frozen=True, slots=True)
class Observed:
    """What one look found. `messages`: the new messages the planner may see (talk.plannable, after
    the receive hooks); `now`: the moment of the look (talk control's rules by time of day);
    `over_budget`: None until the budget was asked, then "" or why it is spent."""

    reason: str
    messages: tuple[Message, ...]
    now: datetime
    bot_message_ids: frozenset[str] = frozenset()
    bot_account: str = ""
    has_planner_commands: bool = False
    commands_ran: bool = False
    over_budget: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    state: TalkState
    messages: tuple[Message, ...] = ()
    mentioned: bool = False
    trigger: str = ""
    over_budget: str = ""
    why: str = ""


def debounce(config: BotConfig) -> tuple[float, float] | None:
    """How news settles before a look: (the seconds of quiet that end a burst, the longest wait for
    them); None: look at once."""
    quiet = config.chat.debounce_seconds
    if quiet <= 0:
        return None
    return quiet, quiet * MAX_DEBOUNCE_PERIODS


def budget_applies(config: BotConfig) -> bool:
    """Whether a look must ask the daily budget (a model is configured and budgets are set)."""
    return not config.offline and bool(config.llm.budgets)


def decide(observed: Observed, session: ChatSession, state: TalkState, config: BotConfig) -> Decision:
    """The next step of a look at `session` (see the module docstring)."""
    messages = observed.messages
    if observed.reason == NEWS and not messages:
        return Decision(Step.SKIP, state, why="nothing new to plan")
    if observed.over_budget is None and budget_applies(config):
        return Decision(Step.ASK_BUDGET, state, messages)
    mentioned = any(mentions_bot(m, config, observed.bot_message_ids, observed.bot_account) for m in messages)
    if config.offline or observed.over_budget:
        return Decision(Step.OFFLINE, state, messages, mentioned, over_budget=observed.over_budget or "")
    if observed.has_planner_commands and not observed.commands_ran:
        return Decision(Step.COMMANDS, state, messages, mentioned)
    if not session.is_private:
        if mentioned:
            state = replace(state, silent_streak=0)
        elif observed.reason == NEWS:
            state = replace(state, backlog=state.backlog + len(messages))
            frequency = talk.talk_frequency(session, cfg=config, now=observed.now)
            if state.backlog < group_bar(frequency, state.silent_streak):
                return Decision(Step.SKIP, state, messages, why="unaddressed group talk below the bar")
    trigger = f"{len(messages)} new message(s)" if observed.reason == NEWS else observed.reason
    return Decision(Step.CYCLE, state, messages, mentioned, trigger)


def after_cycle(
    state: TalkState, *, action: str, mentioned: bool, private: bool, reason: str
) -> tuple[TalkState, bool]:
    """The restraint after a model cycle ended with `action`, and whether to look once more after
    `chat.no_reply_timeout` (only after a silent private answer to news)."""
    streak = state.silent_streak
    if action in SPOKE:
        streak = 0
    elif action == "no_reply" and not mentioned and not private:
        streak += 1
    relook = action == "no_reply" and private and reason == NEWS
    return TalkState(backlog=0, silent_streak=streak), relook
