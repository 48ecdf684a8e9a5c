"""The planner's answer through MaiBot's `maisaka.planner.after_response` and `maisaka.replyer.*` hook
points (chat.events), awaited on the chat's own loop like `maisaka.planner.before_request`.

* `maisaka.planner.after_response`: each model answer the cycle is about to act on (after the stale
  check: a discarded answer is never shown). Handlers may change `response` (the answer's text, kept
  as the cycle's reasoning) and `tool_calls` (drop, change or add calls; only the tools the model was
  offered can run). When they drop every call of an answer that had some, the cycle ends silent
  (`no_reply`, saying so), rather than sending the answer's text as the reply.
* `maisaka.replyer.before_request` / `after_response`: MaiBot's replyer is a second model call that
  writes the reply the planner decided on. Here the planner writes the reply's text itself, in its
  `reply` call, so the planner is the replyer: both points run for each `reply` call, before it is
  carried out, with that text as `response`. before_request has nothing to change (no replyer prompt
  follows); after_response may rewrite the text, withdraw the reply (`response` ""), or ask for another
  (`retry`, with an optional `retry_reason`). A withdrawn reply, or one sent back for another, is not
  sent: the model is told so as the call's result (`withdrawn`) and may answer again in its next round
  (within chat.max_rounds), which is how MaiBot's replyer regenerates.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from chat import events
from chat.agent.llm import LLMResult, ToolCallRequest
from chat.components import ToolErrorCode, error
from chat.models import ChatSession

Point = events.Point


def tool_calls_payload(calls: list[ToolCallRequest]) -> list[dict[str, Any]]:
    """The calls as MaiBot 1.0's hook payload serializes them."""
    return [
        {"id": c.id, "function": {"name": c.name, "arguments": c.arguments if c.arguments is not None else {}}}
        for c in calls
    ]


def _call(raw: dict[str, Any], before: dict[str, ToolCallRequest]) -> ToolCallRequest:
    """One call of a handler's tool_calls (checked by chat.events) → ours; an unchanged one as it was."""
    function = raw.get("function", raw)
    call_id, name, arguments = str(raw.get("id", raw.get("call_id"))), function["name"], function.get("arguments", {})
    old = before.get(call_id)
    if old is not None and old.name == name and (old.arguments if old.arguments is not None else {}) == arguments:
        return old
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return ToolCallRequest(call_id, name, str(function.get("arguments")), None, "not a JSON object")
    return ToolCallRequest(call_id, name, json.dumps(arguments, ensure_ascii=False), arguments)


def _assistant_message(content: str, calls: list[ToolCallRequest]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments or "{}"}}
            for c in calls
        ]
    return message


async def after_response(session: ChatSession, result: LLMResult, built: int) -> tuple[LLMResult, bool]:
    """The answer as the after_response handlers left it, and whether they dropped all its calls."""
    if not result.ok or not events.has_handlers(Point.PLANNER_AFTER_RESPONSE):
        return result, False
    sent = tool_calls_payload(result.tool_calls)
    emission = await events.aemit(
        Point.PLANNER_AFTER_RESPONSE,
        session=session,
        response=result.content,
        tool_calls=sent,
        built_message_count=built,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
    )
    content, raw = emission.kwargs["response"], emission.kwargs["tool_calls"]
    if content == result.content and raw == sent:
        return result, False
    before = {c.id: c for c in result.tool_calls}
    calls = [_call(c, before) for c in raw]
    changed = replace(result, content=content, tool_calls=calls, assistant_message=_assistant_message(content, calls))
    return changed, bool(result.tool_calls) and not calls


async def replies(session: ChatSession, result: LLMResult, attempt: int) -> LLMResult:
    """The answer's `reply` calls through the replyer points (unchanged when nobody listens)."""
    if not any(events.has_handlers(p) for p in (Point.REPLYER_BEFORE_REQUEST, Point.REPLYER_AFTER_RESPONSE)):
        return result
    calls = [
        await _reply(session, c, result.content, attempt) if c.name == "reply" and c.arguments is not None else c
        for c in result.tool_calls
    ]
    if calls == result.tool_calls:
        return result
    return replace(result, tool_calls=calls, assistant_message=_assistant_message(result.content, calls))


async def _reply(session: ChatSession, call: ToolCallRequest, reason: str, attempt: int) -> ToolCallRequest:
    arguments = call.arguments or {}
    text = arguments.get("text")
    if not isinstance(text, str):
        return call  # the reply tool refuses it itself
    quoted = str(arguments.get("quote_message_id") or "").lstrip("#")
    common = {
        "session": session,
        "reply_message_id": quoted,
        "reply_reason": reason,
        "reply_tool_args": {k: v for k, v in arguments.items() if k not in ("text", "quote_message_id")},
        "attempt": attempt,
    }
    await events.aemit(Point.REPLYER_BEFORE_REQUEST, **common)
    emission = await events.aemit(Point.REPLYER_AFTER_RESPONSE, response=text, retry=False, retry_reason="", **common)
    response, retry = emission.kwargs["response"], emission.kwargs["retry"]
    if retry:
        why = emission.kwargs["retry_reason"].strip() or "no reason given"
        refusal = error(ToolErrorCode.WITHDRAWN, f"not sent: a plugin asked for another reply ({why})")
        return replace(call, refusal=refusal)
    if not response.strip():
        refusal = error(ToolErrorCode.WITHDRAWN, "not sent: a plugin withdrew this reply; do not send it again")
        return replace(call, refusal=refusal)
    if response == text:
        return call
    changed = {**arguments, "text": response}
    return replace(call, arguments=changed, raw_arguments=json.dumps(changed, ensure_ascii=False))
