"""The agent-turn engine: a turn's cycle record, the tools of its scope, and its tool calls (run with a
timeout, never raising, recorded).

Every agent turn is an AgentTurn: a chat-planner cycle (chat.planner, scope "chat"), a life-loop turn
(scheduling.life.loop, scope "life") and an offline-planner turn (chat.offline, whose commands call
tools through it):

    turn = AgentTurn.open(kind=CycleKind.LIFE, session=..., trigger=..., scope=LIFE)  # PlannerCycle row
    turn.schemas()                              # the scope's tools offered here, as `tools=[...]`
    outcomes = turn.execute(answer.tool_calls)  # run the model's calls in order, record them
    turn.call("reply", {"text": ...})           # a call the code makes itself, run and recorded alike
    turn.close(action=..., outcome=...)         # end the record

A call never raises. An unknown tool (or one outside the scope), arguments that are not a JSON object
or do not fit the tool's signature, an exception, a result that is not a dict and a timeout each
become an error result the model sees, {"ok": false, "error": {"code": ToolErrorCode..., "message":
...}}, recorded exactly as sent. The model calls themselves go through chat.agent.llm, whose ledger
rows carry the cycle.

One time limit per call (`Tool.time_limit()`: `Tool.timeout`, else `chat.tool_timeout`), handed to
the tool as `ToolContext.timeout` and enforced here only. A sync tool runs in a pool thread that
borrows the caller's database connection (the caller only waits meanwhile, so the connection is never
used by two threads at once, and the tool sees the caller's transaction); one still running at its
deadline keeps that connection and closes it when it ends, and the caller goes on with a fresh one.
An async tool (a coroutine function: plugins' and MCP servers' tools, which only wait for another
process) is awaited under an `asyncio.timeout` and cancelled at the deadline; it must not block its
loop (ORM work goes through core.aio.db).

`execute` and `aexecute` (like `run` and `arun`) carry out one plan (core.plans): sync code runs
every call in its thread (an async tool through async_to_sync: on the caller's event loop when it has
one, its DB work back in the caller's thread); async code (the chat planner) awaits an async tool on
its loop, where no thread waits for it and a slow one costs its own turn its time and nothing any
other chat needs, and runs the sync calls in order in the DB thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from django.db import connections, transaction
from django.utils import timezone

from chat.agent.llm import ToolCallRequest
from chat.components import CHAT, Tool, ToolContext, registry
from chat.components import ToolErrorCode as Code
from chat.components import error as error_result
from chat.models import ChatSession, CycleKind, PlannerCycle, ToolCallRecord
from core.plans import Plan, Step, run_async, run_sync

logger = logging.getLogger(__name__)

# Threads that run tool calls. A tool stuck past its timeout holds one until it returns.
_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="maibot-tool")


@dataclass
class ToolOutcome:
    """One executed call: what the model is told (`result`, `content`) and what it asked for."""

    name: str
    call_id: str
    arguments: dict[str, Any] | None
    result: dict[str, Any]
    content: str  # `result` as the JSON text sent back to the model
    tool: Tool | None = None

    @property
    def ok(self) -> bool:
        return bool(self.result.get("ok"))

    @property
    def code(self) -> str:
        err = self.result.get("error")
        return str(err.get("code", "?")) if isinstance(err, dict) else str(err or "")

    def message(self) -> dict[str, Any]:
        """The `role: tool` message that answers the call in the conversation."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


# What asgiref's async_to_sync reads in a thread that sync_to_async runs: the event loop to run
# coroutines on. A tool thread inherits it from its caller, so a tool behaves as in the caller's thread
# (e.g. a send's wake-up published on the server's loop, not on a new loop per call).
_ASGIREF_THREAD_STATE = ("main_event_loop", "main_event_loop_pid", "task_context")


class _Loan:
    """The caller's database connections (and asgiref thread state) lent to the thread running one
    tool call."""

    def __init__(self) -> None:
        self.connections = {conn.alias: conn for conn in connections.all()}
        self.asgiref_state = {
            name: getattr(SyncToAsync.threadlocal, name)
            for name in _ASGIREF_THREAD_STATE
            if hasattr(SyncToAsync.threadlocal, name)
        }
        self.lock = threading.Lock()
        self.finished = False
        self.abandoned = False
        self.handed_over = False  # the caller took fresh connections: the tool thread closes these
        for conn in self.connections.values():
            conn.inc_thread_sharing()

    def run(self, func, /, *args: Any, **kwargs: Any) -> Any:
        for alias, conn in self.connections.items():
            connections[alias] = conn
        for name, value in self.asgiref_state.items():
            setattr(SyncToAsync.threadlocal, name, value)
        try:
            return func(*args, **kwargs)
        finally:
            for name in self.asgiref_state:
                delattr(SyncToAsync.threadlocal, name)
            for alias in self.connections:
                del connections[alias]
            with self.lock:
                self.finished = True
                abandoned = self.abandoned
            if abandoned:
                self._give_back(close=self.handed_over)

    def returned(self) -> None:
        self._give_back(close=False)

    def abandon(self) -> bool:
        """The caller stops waiting. False when the tool finished at that very moment."""
        with self.lock:
            if self.finished:
                return False
            self.abandoned = True
            # Inside a transaction the caller cannot change connections; it keeps sharing (the
            # engine is never called in one outside tests).
            if not any(conn.in_atomic_block for conn in self.connections.values()):
                self.handed_over = True
                for alias in self.connections:
                    del connections[alias]  # the caller's next query opens a fresh connection
        return True

    def _give_back(self, *, close: bool) -> None:
        for conn in self.connections.values():
            if close:
                try:
                    conn.close()
                except Exception:
                    logger.exception("closing the connection of a timed-out tool failed")
            conn.dec_thread_sharing()


def _invoke(tool: Tool, ctx: ToolContext, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run a sync tool in a pool thread and wait at most `timeout` seconds (TimeoutError after that)."""
    loan = _Loan()
    future = _pool.submit(contextvars.copy_context().run, loan.run, tool.func, ctx, **arguments)
    try:
        result = future.result(timeout=timeout)
    except FutureTimeout:
        if future.cancel():
            loan.returned()
            raise TimeoutError from None
        if loan.abandon():
            raise TimeoutError from None
        result = future.result()  # it just finished
    except BaseException:
        loan.returned()
        raise
    loan.returned()
    return result


async def _ainvoke(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> dict[str, Any]:
    """Await an async tool on this loop for at most `ctx.timeout` seconds (TimeoutError after that: the
    tool is cancelled)."""
    async with asyncio.timeout(ctx.timeout):
        return await tool.func(ctx, **arguments)


def _running(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Step:
    """The step that runs one call and cuts it at `ctx.timeout`, the one place a tool call's time
    limit is enforced: a sync tool in a pool thread; an async one awaited (from sync code through
    async_to_sync, in the caller's thread)."""
    if tool.is_async:
        return Step(partial(async_to_sync(_ainvoke), tool, ctx, arguments), partial(_ainvoke, tool, ctx, arguments))
    return Step(partial(_invoke, tool, ctx, arguments, ctx.timeout))


def _request(name: str, arguments: dict[str, Any] | None, call_id: str) -> ToolCallRequest:
    """A call the code makes itself, as if the model had asked for it."""
    return ToolCallRequest(id=call_id, name=name, raw_arguments="", arguments=arguments)


def _checked(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise TypeError(f"tool returned {type(result).__name__}, not a dict")
    return result


def _misfit(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> str:
    """Why the arguments do not fit the tool's signature ("" when they do)."""
    try:
        inspect.signature(tool.func).bind(ctx, **arguments)
    except TypeError as exc:
        return str(exc)
    return ""


class AgentTurn:
    """One agent turn: its PlannerCycle, the tools of its scope, its recorded tool calls (sync)."""

    def __init__(
        self,
        cycle: PlannerCycle,
        *,
        session: ChatSession | None,
        scope: str = CHAT,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.cycle = cycle
        self.session = session
        self.scope = scope
        # Shared by the turn's calls (ToolContext.extra): e.g. what was already sent this turn.
        self.extra: dict[str, Any] = extra if extra is not None else {}
        self._next_round = 0

    @classmethod
    def open(
        cls,
        *,
        kind: CycleKind,
        session: ChatSession | None,
        trigger: str,
        started_at: datetime | None = None,
        cycle_id: uuid.UUID | None = None,
        prompt: list[dict[str, Any]] | None = None,
        scope: str = CHAT,
        extra: dict[str, Any] | None = None,
    ) -> AgentTurn:
        """Write the cycle's record (open: no ended_at yet) and start the turn."""
        cycle = PlannerCycle.objects.create(
            cycle_id=cycle_id or uuid.uuid4(),
            session=session,
            kind=kind,
            started_at=started_at or timezone.now(),
            trigger=trigger[:255],
            prompt=prompt or [],
        )
        return cls(cycle, session=session, scope=scope, extra=extra)

    # --- tools ----------------------------------------------------------------------------------------

    def context(self, tool_call_id: str = "") -> ToolContext:
        return ToolContext(session=self.session, tool_call_id=tool_call_id, cycle=self.cycle, extra=self.extra)

    def tools(self) -> list[Tool]:
        """The tools of this turn's scope that are offered in its context."""
        return registry.available(ToolContext(session=self.session, cycle=self.cycle), self.scope)

    def schemas(self, tools: list[Tool] | None = None) -> list[dict[str, Any]]:
        return [tool.schema() for tool in (self.tools() if tools is None else tools)]

    def _resolve(
        self, call: ToolCallRequest, offered: dict[str, Tool] | None
    ) -> tuple[Tool | None, ToolContext, dict[str, Any] | None]:
        """The tool a call names, its context, and the error result when it cannot run (None: it can)."""
        name, arguments = call.name, call.arguments
        if offered is None:
            tool = registry.get(name)
            tool = tool if tool is not None and self.scope in tool.scopes else None
            names = ", ".join(t.name for t in self.tools()) if tool is None else ""
        else:
            tool = offered.get(name)
            names = ", ".join(offered)
        ctx = self.context(call.id)
        if tool is None:
            return None, ctx, error_result(Code.UNKNOWN_TOOL, f"there is no tool {name!r}; use one of: {names}")
        ctx.timeout = tool.time_limit()
        if call.refusal is not None:
            return tool, ctx, call.refusal
        if arguments is None:
            problem = f"the arguments are not a JSON object: {call.argument_error}"
        else:
            problem = _misfit(tool, ctx, arguments)
        return tool, ctx, error_result(Code.INVALID_ARGUMENTS, problem) if problem else None

    def _failed(self, name: str, timeout: float, exc: Exception) -> dict[str, Any]:
        """The error result of a call that raised (a timeout, or the tool's own failure)."""
        if isinstance(exc, TimeoutError):
            logger.warning("tool %s timed out after %gs in cycle %s", name, timeout, self.cycle.cycle_id)
            return error_result(Code.TOOL_TIMEOUT, f"{name} did not finish within {timeout:g}s")
        logger.error("tool %s failed in cycle %s", name, self.cycle.cycle_id, exc_info=exc)
        return error_result(Code.TOOL_FAILED, f"{type(exc).__name__}: {exc}"[:500])

    @staticmethod
    def _outcome(
        name: str, call_id: str, arguments: dict[str, Any] | None, res: dict[str, Any], tool: Tool | None
    ) -> ToolOutcome:
        # What is recorded is exactly what the model is told (and anything odd becomes text).
        content = json.dumps(res, ensure_ascii=False, default=str)
        return ToolOutcome(
            name=name, call_id=call_id, arguments=arguments, result=json.loads(content), content=content, tool=tool
        )

    def _call(self, call: ToolCallRequest, offered: dict[str, Tool] | None) -> Plan[ToolOutcome]:
        """One call, resolved, run within its time limit and checked (not recorded). `offered`: the
        tools the model was shown (None: the scope's)."""
        name, arguments = call.name, call.arguments
        tool, ctx, res = self._resolve(call, offered)
        if res is None:
            try:
                res = _checked((yield _running(tool, ctx, arguments)))
            except Exception as exc:
                res = self._failed(name, ctx.timeout, exc)
        return self._outcome(name, call.id, arguments, res, tool)

    def run(self, name: str, arguments: dict[str, Any] | None, *, call_id: str = "") -> ToolOutcome:
        """Run one call to a tool of this turn's scope (not recorded)."""
        return run_sync(self._call(_request(name, arguments, call_id), None))

    async def arun(self, name: str, arguments: dict[str, Any] | None, *, call_id: str = "") -> ToolOutcome:
        """run() from async code: an async tool awaited on this loop, a sync one in the DB thread."""
        return await run_async(self._call(_request(name, arguments, call_id), None))

    def _record(
        self, outcome: ToolOutcome, round_no: int, *, raw_arguments: str = "", recorded_arguments=None
    ) -> ToolCallRecord:
        arguments = recorded_arguments if recorded_arguments is not None else outcome.arguments
        return ToolCallRecord(
            cycle=self.cycle,
            round=round_no,
            tool_call_id=outcome.call_id,
            name=outcome.name[:128],
            arguments=arguments if arguments is not None else {},
            raw_arguments=raw_arguments,
            result=outcome.result,
            ok=outcome.ok,
        )

    def execute(
        self,
        calls: list[ToolCallRequest],
        *,
        round_no: int = 0,
        tools: list[Tool] | None = None,
        close: Any = None,
    ) -> list[ToolOutcome]:
        """Run the model's calls in order and record them. `tools`: what the model was offered (default:
        the scope's tools now). `close(outcomes) -> fields | None`: when it returns fields, the cycle's
        record is closed with them in the same transaction as the calls' records."""
        return run_sync(self._execute(calls, round_no, tools, close))

    async def aexecute(
        self,
        calls: list[ToolCallRequest],
        *,
        round_no: int = 0,
        tools: list[Tool] | None = None,
        close: Any = None,
    ) -> list[ToolOutcome]:
        """execute() from async code: the same calls in the same order, recorded the same way, but a
        call to an async tool is awaited here (no thread waits for it). The sync calls before it run in
        one trip to the DB thread, the rest together with the records in another."""
        return await run_async(self._execute(calls, round_no, tools, close))

    def _execute(
        self, calls: list[ToolCallRequest], round_no: int, tools: list[Tool] | None, close: Any
    ) -> Plan[list[ToolOutcome]]:
        """The calls in order, recorded: async tools one by one, the sync calls between them each run
        as one step, the last ones in the step that records them all."""
        if tools is None:
            tools = yield Step(self.tools)
        offered = {t.name: t for t in tools}
        done: list[ToolOutcome] = []
        try:
            for i, c in enumerate(calls):
                tool = offered.get(c.name)
                if tool is None or not tool.is_async:
                    continue
                if len(done) < i:
                    done += yield Step(partial(self._run_all, calls[len(done) : i], offered))
                done.append((yield from self._call(c, offered)))
        except asyncio.CancelledError:
            if done:  # what ran before the turn was stopped is recorded all the same
                yield Step(partial(self._finish, calls[: len(done)], done, offered, round_no=round_no))
            raise
        return (yield Step(partial(self._finish, calls, done, offered, round_no=round_no, close=close)))

    def _run_all(self, calls: list[ToolCallRequest], offered: dict[str, Tool]) -> list[ToolOutcome]:
        return [run_sync(self._call(c, offered)) for c in calls]

    def _finish(
        self,
        calls: list[ToolCallRequest],
        done: list[ToolOutcome],
        offered: dict[str, Tool],
        *,
        round_no: int,
        close: Any = None,
    ) -> list[ToolOutcome]:
        """Run the calls after the first len(done) (those already run), then record them all."""
        outcomes = [*done, *self._run_all(calls[len(done) :], offered)]
        records = [
            self._record(o, round_no, raw_arguments=c.raw_arguments) for o, c in zip(outcomes, calls, strict=True)
        ]
        # The tools ran outside this transaction, so a slow tool never holds the database's write lock.
        with transaction.atomic():
            ToolCallRecord.objects.bulk_create(records)
            fields = close(outcomes) if close is not None else None
            if fields is not None:
                self.close(**fields)
        self._next_round = max(self._next_round, round_no + 1)
        return outcomes

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str = "",
        round_no: int | None = None,
        recorded_arguments: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A call the code makes itself (a command, a plain-text answer sent as the reply): run and
        recorded like the model's; each such call is its own round unless `round_no` is given."""
        if round_no is None:
            round_no = self._next_round
            self._next_round += 1
        outcome = self.run(name, arguments, call_id=call_id)
        self._record(outcome, round_no, recorded_arguments=recorded_arguments).save()
        return outcome.result

    # --- the record -----------------------------------------------------------------------------------

    def close(self, **fields: Any) -> None:
        """End the cycle's record with these fields (action, reasoning, outcome, error, timings, ...)."""
        close_cycle(cycle=self.cycle, fields=fields)


def close_cycle(*, cycle: PlannerCycle, fields: dict[str, Any]) -> None:
    for name, value in fields.items():
        setattr(cycle, name, value)
    cycle.ended_at = timezone.now()
    cycle.save(update_fields=[*fields, "ended_at"])


def abandon_cycle(*, cycle_id: uuid.UUID) -> None:
    """Close a cycle whose turn was stopped (e.g. cancelled while its record was being opened)."""
    PlannerCycle.objects.filter(cycle_id=cycle_id, ended_at__isnull=True).update(
        action="cancelled", error="the runtime was stopped during the cycle", ended_at=timezone.now()
    )
