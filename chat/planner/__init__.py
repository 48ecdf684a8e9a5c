"""The chat planner: one observe → plan → execute cycle of a session, its prompt, and its record.

Modules, one job each: decision (whether to speak now: skip / offline / commands / cycle), observe (the
news since the last look, through the receive hooks), rules (mentions, the group-chat bar, plain text as a
reply), prompts (the registered Prompts, history and cycle-record rendering), history (HistoryCache;
HistoryLine lives in prompts), cycle (run_cycle, on the agent-turn engine chat.agent.engine). The session
runtime (chat/session_runtime.py) uses them.

A cycle (run by the session's runtime, chat/session_runtime.py) gets the messages that arrived since the
last one, renders the prompt, calls the model once with the tools (`chat.agent.llm.complete`, purpose
"planner"), executes the tool calls, and feeds their results back in the same cycle until the model
ends its turn with `reply` / `no_reply` / `send_emoji` or `chat.max_rounds` calls were made. Every
cycle is a PlannerCycle row (phase timings, action, reasoning, outcome, replanned, error, the full
conversation sent); every tool call a ToolCallRecord; every model call an LLMCall linked to it.

When does the bot speak? The runtime asks chat/planner/decision.py (a pure `decide`), whose docstring
holds the rules: mentions, the group-chat bar, offline mode and the budget, the look after a silent turn.

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
