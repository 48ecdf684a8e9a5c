"""The component registry: what the apps above `chat` (and plugins) plug into the bot.

* Tools the agent turns offer to the model. A tool is a function taking a ToolContext and its JSON
  arguments and returning a JSON-able dict: {"ok": true, ...} or {"ok": false, "error": {"code": ...,
  "message": ...}}; a plain sync function, or a coroutine function for a tool that waits for another
  process (a plugin's, an MCP server's: awaited on the turn's loop, see chat.agent.engine). The
  session is implicit: it comes from the context, never from the model's arguments. A tool belongs
  to one or more *scopes*: the chat planner offers the "chat" tools, the life loop the "life" tools
  (chat.agent.engine runs them all the same way).
* Commands: handlers that read what people type before any model does. The offline planner asks
  them all; those marked `before_planner` (plugins' commands) are also asked before every chat-planner
  cycle (chat.commands), and a message one of them handles never reaches the model. A command gets
  the turn and one typed text and says whether it handled it (`command_handle` asks it).
* Context blocks other apps add to the planner's prompt (inner state, memory slots, summary…): a sync
  function (session) -> str; an empty string means "nothing to say". The planner renders the
  registered blocks in `order` (stable, cache-friendly blocks first).

`chat` imports none of the apps that register here: each registers from its AppConfig.ready().
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from asgiref.sync import iscoroutinefunction

from chat.models import ChatSession, Message
from core.aio import db
from core.config import get_config


class ToolErrorCode(StrEnum):
    """Failures of the engine and of chat's own tools (stable strings: the model reads them)."""

    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"  # not a JSON object, or not matching the tool's signature
    INVALID_ARGUMENT = "invalid_argument"  # one argument's value is refused by the tool
    TOOL_FAILED = "tool_failed"
    TOOL_TIMEOUT = "tool_timeout"
    ALREADY_SENT = "already_sent"
    TEXT_TOO_LONG = "text_too_long"
    NO_MATCH = "no_match"
    MEDIA_UNAVAILABLE = "media_unavailable"
    WITHDRAWN = "withdrawn"  # a plugin hook withdrew the call before it ran (chat.planner.hooks)


CHAT = "chat"  # the chat planner's scope (the default)
LIFE = "life"  # the life loop's scope


@dataclass
class ToolContext:
    session: ChatSession | None
    tool_call_id: str = ""
    cycle: Any = None  # chat.models.PlannerCycle of the turn that runs the tool
    extra: dict[str, Any] = field(default_factory=dict)  # shared by the calls of one turn
    # The seconds this call may take (Tool.time_limit), set and enforced by the engine, which cuts the
    # call there. A tool that hands its work to another process passes it on, so the work stops there
    # when the engine stops waiting; it adds no limit of its own.
    timeout: float | None = None


ToolFunc = Callable[..., dict[str, Any]] | Callable[..., Awaitable[dict[str, Any]]]


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
    # The agent turns that offer it (CHAT: the chat planner, LIFE: the life loop).
    scopes: frozenset[str] = frozenset({CHAT})
    # Seconds one call may run; None: the config's chat.tool_timeout.
    timeout: float | None = None

    def time_limit(self) -> float:
        """Seconds one call may run: `timeout`, else the config's chat.tool_timeout."""
        return self.timeout or get_config().chat.tool_timeout

    @property
    def is_async(self) -> bool:
        """A coroutine function: awaited on the turn's loop, not run in a thread (chat.agent.engine)."""
        return iscoroutinefunction(self.func)

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools=[...]` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, ctx: ToolContext, **arguments: Any) -> Any:
        return self.func(ctx, **arguments)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        # Tools come and go while the process runs (an MCP server's, as it connects and drops), in
        # the event loop's thread while turns read the registry in theirs: writers swap in a new dict.
        self._lock = threading.Lock()

    def register(self, tool: Tool) -> Tool:
        with self._lock:
            if tool.name in self._tools:
                raise ValueError(f"tool {tool.name!r} is already registered")
            self._tools = {**self._tools, tool.name: tool}
        return tool

    def unregister(self, name: str) -> bool:
        """Remove a tool; False when there was none by that name."""
        with self._lock:
            if name not in self._tools:
                return False
            self._tools = {k: v for k, v in self._tools.items() if k != name}
        return True

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def available(self, ctx: ToolContext, scope: str = CHAT) -> list[Tool]:
        """The tools of `scope` offered in this context."""
        return [t for t in self._tools.values() if scope in t.scopes and t.available(ctx)]

    def names(self) -> list[str]:
        return list(self._tools)


registry = ToolRegistry()


def register_tool(
    name: str,
    description: str,
    func: ToolFunc,
    *,
    parameters: dict[str, Any] | None = None,
    properties: dict[str, Any] | None = None,
    required: Sequence[str] = (),
    **options: Any,
) -> Tool:
    """Put a tool in the registry and return it (ValueError when its name is taken): the one way tools
    are registered. Its arguments' JSON Schema is `parameters`, or an object of `properties` (with
    `required` among them) that takes no other keys. `options`: the Tool's other fields."""
    if parameters is None:
        parameters = {"type": "object", "properties": properties or {}}
        if required:
            parameters["required"] = list(required)
        parameters["additionalProperties"] = False
    return registry.register(Tool(name=name, description=description, parameters=parameters, func=func, **options))


def ok(**payload: Any) -> dict[str, Any]:
    return {"ok": True, **payload}


def error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": str(code), "message": message}}


# --- context blocks -------------------------------------------------------------------------------

ContextProvider = Callable[[ChatSession | None], str]


@dataclass(frozen=True)
class ContextBlock:
    name: str
    order: int
    provider: ContextProvider


_blocks: dict[str, ContextBlock] = {}


def register_context_block(name: str, provider: ContextProvider, *, order: int = 100) -> None:
    if name in _blocks:
        raise ValueError(f"context block {name!r} is already registered")
    _blocks[name] = ContextBlock(name=name, order=order, provider=provider)


def context_blocks(session: ChatSession | None) -> list[tuple[str, str]]:
    """(name, text) of every registered block with something to say, in order. Sync: async code calls
    it through core.aio.db."""
    out = []
    for block in sorted(_blocks.values(), key=lambda b: (b.order, b.name)):
        text = block.provider(session)
        if text:
            out.append((block.name, text))
    return out


# --- commands -------------------------------------------------------------------------------------


class CommandTurn(Protocol):
    """What a command may do in the turn that asked it: call a tool (recorded like the model's own
    calls) and answer in the chat."""

    session: ChatSession
    message: Message | None  # the message whose text the command is reading

    def tool(self, name: str, **arguments: Any) -> dict[str, Any]: ...

    def answer(self, text: str, action: str) -> None: ...

    def note(self, outcome: str) -> None:
        """Record what a command did that is not an answer (e.g. a plugin that sent by itself)."""


@dataclass(frozen=True)
class Command:
    name: str
    # (turn, typed text) -> True when the command handled the text (answered, well or with an error).
    # Sync, or a coroutine function for a command that waits for another process (a plugin's): that
    # one is awaited on the turn's loop and may use the turn's `answer` and `note`, not its `tool`.
    handle: Callable[[CommandTurn, str], bool] | Callable[[CommandTurn, str], Awaitable[bool]]
    order: int = 100
    # What the command understands, per language ("zh", "en"), for the offline notice.
    help: dict[str, str] = field(default_factory=dict)
    # Also asked before every chat-planner cycle (not only by the offline planner); `matches(text)`
    # then says cheaply whether `handle` wants the text, so unmatched messages open no turn.
    before_planner: bool = False
    matches: Callable[[str], bool] | None = None


_commands: dict[str, Command] = {}


def register_command(command: Command) -> None:
    if command.name in _commands:
        raise ValueError(f"command {command.name!r} is already registered")
    _commands[command.name] = command


def unregister_command(name: str) -> Command | None:
    return _commands.pop(name, None)


def commands() -> list[Command]:
    return sorted(_commands.values(), key=lambda c: (c.order, c.name))


async def command_handle(command: Command, turn: CommandTurn, text: str) -> bool:
    """Ask one command from async code: an async handler is awaited here (no thread waits for a
    plugin's answer), a sync one runs in the caller's DB thread (core.aio.db), where its tool calls
    and queries belong."""
    if iscoroutinefunction(command.handle):
        return await command.handle(turn, text)
    return await db(command.handle)(turn, text)
