"""The chat planner: one observe → plan → execute cycle of a session, its prompt, and its record.

Modules, one job each: prompts (the registered Prompts, history and cycle-record rendering), rules
(mentions, the group-chat bar, plain text as a reply), history (HistoryCache; HistoryLine lives in prompts), cycle
(run_cycle, on the agent-turn engine chat.agent.engine). chat/runtime.py uses what this package exports.

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
  those or whose id is the bot's own account on the platform (`bot.platform_accounts`, else the one
  the adapter named in a receiver_info; see chat.accounts: a QQ mention arrives as
  `@<QQ nickname:QQ id>`, whatever the bot's nickname in our config), or when it quotes one of the
  bot's own messages. A mention always starts a cycle.
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
message (not JSON, not tool-call markup, at most `chat.max_reply_length` characters) is sent as the reply and
recorded as a `reply` tool call with `from_content: true`. Anything else (and any content in a group
chat) is not sent: the cycle ends as no_reply with the text kept in its outcome. Provider errors
(HTTP 5xx, timeouts, malformed answers) end the cycle with `error` set and nothing sent; the
runtime goes on with the next message. Unknown tools, bad arguments, failing and timed-out tools
become error tool results the model sees (and they are recorded), never exceptions.

Offline mode (no model configured): the clearly labelled offline planner (chat/offline.py) answers
instead, recorded as a cycle with no LLM call.
"""

from chat.planner.cycle import CycleResult, run_cycle
from chat.planner.history import HistoryCache
from chat.planner.rules import group_bar, mentions_bot

__all__ = ["CycleResult", "HistoryCache", "group_bar", "mentions_bot", "run_cycle"]
