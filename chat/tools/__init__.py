"""The tool registry: tools the planner (and later plugins) offer to the model.

A tool is a plain sync function taking a ToolContext and its JSON arguments and returning a
JSON-able dict: {"ok": true, ...} or {"ok": false, "error": {"code": ..., "message": ...}}.
The session is implicit: it comes from the context, never from the model's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chat.models import ChatSession


@dataclass
class ToolContext:
    session: ChatSession
    tool_call_id: str = ""
    cycle: Any = None  # chat.models.PlannerCycle when run by the planner
    extra: dict[str, Any] = field(default_factory=dict)


ToolFunc = Callable[..., dict[str, Any]]


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments
    func: ToolFunc
    # Decides per session whether the model is offered the tool (e.g. private chats only).
    available: Callable[[ToolContext], bool] = lambda ctx: True
    # The planner's cycle ends once such a tool succeeded (reply, no_reply, send_emoji): its result
    # is not sent back to the model, so a plain reply costs exactly one LLM call.
    ends_cycle: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools=[...]` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
        return self.func(ctx, **arguments)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def available(self, ctx: ToolContext) -> list[Tool]:
        return [t for t in self._tools.values() if t.available(ctx)]

    def names(self) -> list[str]:
        return list(self._tools)


registry = ToolRegistry()


def ok(**payload: Any) -> dict[str, Any]:
    return {"ok": True, **payload}


def error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": str(code), "message": message}}
