"""The MCP servers the bot uses ([[mcp.servers]]): one link per server, kept connected in the ASGI
process's event loop (where the chat planner runs), its tools registered in chat's component registry
as `<server>__<tool>` while it is up.

A link connects (stdio: starts the command; streamable HTTP: the URL with its headers), lists the
server's tools, offers the allowed ones, and pings the server every PING_SECONDS. When the connection
breaks (the process died, a ping or a call found it gone) its tools are removed at once and the link
reconnects with backoff (1 s doubling to 30 s). A config reload restarts exactly the links whose entry
changed. A tool is async (chat.agent.engine awaits it on the turn's loop, so a slow server holds no
thread another chat needs): its arguments are checked against the server's schema, then the call is
handed to the link's loop and waited for at most the entry's call_timeout_seconds; a dead server
answers at once with mcp_unavailable, so it never holds up a cycle. What each process sees is kept in
McpServerState for the admin.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import F
from django.utils import timezone

from chat.components import CHAT, LIFE, ToolContext, ToolErrorCode, error, ok, register_tool, registry
from core.aio import background_loop, db, wait_event
from core.config import BotConfig, McpServerEntry, get_config, mcp_secret_resolve
from core.reload import register_reload_callback
from scheduling.mcp.models import McpLinkState, McpServerState

if TYPE_CHECKING:
    # The SDK, its HTTP client and the schema validator are imported when a link first connects (see
    # scheduling.mcp): every process imports this module (the life loop's tools), few ever connect.
    from jsonschema import Draft202012Validator
    from mcp import ClientSession, types

logger = logging.getLogger(__name__)

PING_SECONDS = 5.0
STALE = timedelta(days=1)
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 30.0
MAX_RESULT_CHARS = 8000
UNAVAILABLE = "mcp_unavailable"
TOOL_ERROR = "mcp_tool_error"
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


def offered_name(server: str, tool: str) -> str:
    """The name the model sees: OpenAI allows [A-Za-z0-9_-]{1,64}."""
    return f"{server}__{_NAME_OK.sub('_', tool)}"[:64]


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:128]


def _text(result: types.CallToolResult) -> str:
    from mcp import types

    parts = []
    for block in result.content:
        parts.append(block.text if isinstance(block, types.TextContent) else f"[{block.type}]")
    return "\n".join(parts)[:MAX_RESULT_CHARS]


class ServerLink:
    """One configured server, kept connected by its own task."""

    def __init__(self, entry: McpServerEntry, loop: asyncio.AbstractEventLoop, scope: str = CHAT) -> None:
        self.entry = entry
        self.loop = loop
        self.scope = scope
        # Set once the first connection attempt has an outcome (its tools offered, or the error).
        self.settled = threading.Event()
        self.session: ClientSession | None = None
        self.offered: dict[str, str] = {}  # offered name -> the server's tool name
        self.validators: dict[str, Draft202012Validator] = {}
        self._broken = asyncio.Event()
        self.task = loop.create_task(self._run(), name=f"mcp-link-{entry.name}")

    @property
    def transport(self) -> str:
        return "stdio" if self.entry.command else "http"

    # --- connection -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        import httpx2
        from mcp import ClientSession, StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        e = self.entry
        async with contextlib.AsyncExitStack() as stack:
            if e.command:
                env = {k: mcp_secret_resolve(v) for k, v in e.env.items()}
                params = StdioServerParameters(command=e.command, args=list(e.args), env=env or None)
                read, write = await stack.enter_async_context(stdio_client(params))
            else:
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers={k: mcp_secret_resolve(v) for k, v in e.headers.items()},
                        timeout=httpx2.Timeout(e.connect_timeout_seconds),
                    )
                )
                read, write = await stack.enter_async_context(streamable_http_client(e.url, http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            yield session

    async def _run(self) -> None:
        backoff = BACKOFF_FIRST
        await self._save(state=McpLinkState.STARTING, tools=[])
        while True:
            try:
                async with self._connect() as session:
                    await asyncio.wait_for(session.initialize(), self.entry.connect_timeout_seconds)
                    listed = await asyncio.wait_for(session.list_tools(), self.entry.connect_timeout_seconds)
                    self.session = session
                    self._broken.clear()
                    self._offer(listed.tools)
                    await self._save(state=McpLinkState.READY, tools=sorted(self.offered), connected=True)
                    self.settled.set()
                    logger.info("MCP server %s connected: %d tools offered", self.entry.name, len(self.offered))
                    backoff = BACKOFF_FIRST
                    await self._watch(session)
            except asyncio.CancelledError:
                self._withdraw()
                raise
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    raise
                self._withdraw()
                reason = _reason(exc)
                logger.warning("MCP server %s is down: %s (retry in %gs)", self.entry.name, reason, backoff)
                await self._save(state=McpLinkState.DOWN, tools=[], error=reason)
                self.settled.set()
            else:
                self._withdraw()
                await self._save(state=McpLinkState.DOWN, tools=[], error="the connection closed")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _watch(self, session: ClientSession) -> None:
        """Return when the connection is gone: a ping unanswered, or a call that found it broken."""
        while True:
            if await wait_event(self._broken, PING_SECONDS):
                raise ConnectionError("a call found the connection broken")
            await asyncio.wait_for(session.send_ping(), PING_SECONDS)

    def _offer(self, tools: list[types.Tool]) -> None:
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        allowed = set(self.entry.tools)
        for tool in tools:
            if "*" not in allowed and tool.name not in allowed:
                continue
            name = offered_name(self.entry.name, tool.name)
            schema = dict(tool.input_schema or {"type": "object"})
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as exc:
                logger.warning(
                    "MCP server %s: tool %s has an invalid schema (%s); not offered",
                    self.entry.name,
                    tool.name,
                    exc.message,
                )
                continue
            try:
                register_tool(
                    name,
                    f"[{self.entry.name}] {tool.description or tool.name}"[:1024],
                    self._tool_func(name),
                    parameters=schema,
                    scopes=frozenset({self.scope}),
                    # The link's own deadline answers first, with a clearer error.
                    timeout=self.entry.call_timeout_seconds + 2,
                )
            except ValueError:
                logger.warning("MCP server %s: tool name %s is taken; not offered", self.entry.name, name)
                continue
            self.offered[name] = tool.name
            self.validators[name] = Draft202012Validator(schema)

    def _withdraw(self) -> None:
        self.session = None
        for name in self.offered:
            registry.unregister(name)
        self.offered, self.validators = {}, {}

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task
        self._withdraw()
        await self._save(state=McpLinkState.STOPPED, tools=[])

    # --- calls (awaited by the engine, on any loop) ---------------------------------------------

    def _tool_func(self, name: str):
        async def call(ctx: ToolContext, **arguments: Any) -> dict[str, Any]:
            return await self.call(name, arguments)

        return call

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        validator, remote, session = self.validators.get(name), self.offered.get(name), self.session
        if validator is None or remote is None or session is None:
            return error(UNAVAILABLE, f"the MCP server {self.entry.name} is not connected; try again later")
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            first = problems[0]
            where = ".".join(str(p) for p in first.path) or "arguments"
            return error(ToolErrorCode.INVALID_ARGUMENTS, f"{where}: {first.message}"[:500])
        started = time.monotonic()
        timeout = self.entry.call_timeout_seconds
        # On the link's loop (the caller's in the server; a life-loop turn's is another); cancelled with
        # the wait.
        future = asyncio.run_coroutine_threadsafe(
            session.call_tool(remote, arguments, read_timeout_seconds=timeout), self.loop
        )
        try:
            async with asyncio.timeout(timeout):
                result = await asyncio.wrap_future(future)
        except TimeoutError:
            outcome = error(ToolErrorCode.TOOL_TIMEOUT, f"{name} did not finish within {timeout:g}s")
        except Exception as exc:  # the connection broke under the call, or the server refused it
            self.loop.call_soon_threadsafe(self._broken.set)
            outcome = error(UNAVAILABLE, f"the MCP server {self.entry.name} failed: {_reason(exc)}"[:500])
        else:
            if result.is_error:
                outcome = error(TOOL_ERROR, _text(result) or "the tool failed")
            elif result.structured_content is not None:
                outcome = ok(result=result.structured_content)
            else:
                outcome = ok(result=_text(result))
        await db(self._count)(ok=bool(outcome.get("ok")), ms=(time.monotonic() - started) * 1000)
        return outcome

    def _count(self, *, ok: bool, ms: float) -> None:
        McpServerState.objects.filter(name=self.entry.name, process=_process()).update(
            calls=F("calls") + 1,
            failed_calls=F("failed_calls") + (0 if ok else 1),
            total_call_ms=F("total_call_ms") + ms,
        )

    # --- the admin's view -----------------------------------------------------------------------

    async def _save(self, *, state: str, tools: list[str], error: str = "", connected: bool = False) -> None:
        now = timezone.now()
        if state == McpLinkState.STARTING:
            # Rows of processes long gone (every restart is a new process).
            await db(McpServerState.objects.filter(updated_at__lt=now - STALE).delete, fresh=True)()
        fields: dict[str, Any] = {"state": state, "tools": tools, "transport": self.transport}
        if error:
            fields.update(last_error=error[:2000], last_error_at=now)
        if connected:
            fields["connected_at"] = now
        try:
            await db(McpServerState.objects.update_or_create, fresh=True)(
                name=self.entry.name, process=_process(), defaults=fields
            )
        except Exception:
            logger.exception("could not record the state of MCP server %s", self.entry.name)


def _reason(exc: BaseException) -> str:
    """The innermost cause of a transport failure (the SDK raises through nested task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


class McpClients:
    """Every configured server's link in this process, for one scope: the chat planner's in the ASGI
    server, the life loop's in a cluster worker."""

    def __init__(self, scope: str = CHAT) -> None:
        self.scope = scope
        self.links: dict[str, ServerLink] = {}
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.loop is not None:
            return
        self.loop = loop
        register_reload_callback(self._on_reload, priority=200, name="mcp clients")
        self.apply(get_config())

    def _on_reload(self, new: BotConfig, old: BotConfig) -> None:
        if self.loop is not None and not self.loop.is_closed() and new.mcp != old.mcp:
            self.loop.call_soon_threadsafe(self.apply, new)

    def apply(self, config: BotConfig) -> list[ServerLink]:
        """Start, restart and stop links so they match the config (in the loop's thread); returns the
        links it started."""
        wanted = {e.name: e for e in config.mcp.servers if e.enabled and self.scope in e.scopes}
        for name, link in list(self.links.items()):
            if wanted.get(name) != link.entry:
                del self.links[name]
                self.loop.create_task(link.stop())
        started = []
        for name, entry in wanted.items():
            if name not in self.links:
                self.links[name] = ServerLink(entry, self.loop, self.scope)
                started.append(self.links[name])
        return started

    async def stop(self) -> None:
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)


clients = McpClients(CHAT)


class LifeMcpClients(McpClients):
    """The life loop's servers in a cluster worker (sync code, no event loop of its own): the links
    live on the worker's background loop (core.aio), from the first turn that needs them."""

    def __init__(self) -> None:
        super().__init__(LIFE)
        self._pid: int | None = None
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Make the links match the config; wait (at most each server's connect timeout) for new ones
        to connect, so a turn that needs their tools is offered them."""
        config = get_config()
        if not any(e.enabled and LIFE in e.scopes for e in config.mcp.servers) and not self.links:
            return
        with self._lock:
            if self._pid != os.getpid():  # first use in this (forked) worker
                self._pid, self.links = os.getpid(), {}
                self.loop = background_loop()
            future = concurrent.futures.Future()
            self.loop.call_soon_threadsafe(lambda: future.set_result(self.apply(config)))
            started = future.result(timeout=10)
        deadline = time.monotonic() + max((link.entry.connect_timeout_seconds for link in started), default=0)
        for link in started:
            link.settled.wait(max(0.0, deadline - time.monotonic()))


life_clients = LifeMcpClients()


def start_mcp_clients_on_first_call(app):
    """Wrap the ASGI app so the server connects to the configured MCP servers when it first serves
    (daphne sends no lifespan events); they are stopped before daphne's loop goes away."""
    from core.process import call_before_server_shutdown

    async def wrapper(scope, receive, send):
        if clients.loop is None:
            loop = asyncio.get_running_loop()
            clients.start(loop)
            call_before_server_shutdown(loop, clients.stop)
        return await app(scope, receive, send)

    return wrapper
