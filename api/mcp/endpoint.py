"""The bot's own MCP endpoint at /mcp: the official SDK's low-level server over streamable HTTP, behind
the proactive API's bearer tokens (api.access); its tools and resources live in
api.mcp.endpoint_tools.

Stateless streamable HTTP with JSON answers: every POST carries its own bearer token and is served on
its own, so several server processes behind a load balancer need no sticky sessions. The SDK's session
manager needs a running task group; daphne sends no ASGI lifespan events, so the first request starts
it in this process's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from mcp import types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from api.access import api_token_authenticate
from api.errors import ApiError, ApiErrorCode
from api.mcp import endpoint_tools
from chat.models import ApiToken
from core.aio import db
from core.config import get_config
from core.process import call_before_server_shutdown

logger = logging.getLogger(__name__)

SCOPE_TOKEN_KEY = "maibot.api_token_id"
_HISTORY_URI = re.compile(r"^maibot://conversations/(?P<conversation_id>[^/]{1,128})/messages$")


# --- the MCP server ---------------------------------------------------------------------------------


def _token_id(ctx: ServerRequestContext[Any, Any]) -> int:
    request = ctx.request
    token_id = request.scope.get(SCOPE_TOKEN_KEY) if request is not None else None
    if token_id is None:  # cannot happen behind McpEndpoint; refuse rather than serve anonymously
        raise MCPError(code=types.INVALID_REQUEST, message="not_authenticated: send Authorization: Bearer <token>")
    return token_id


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=None)


def _refused(exc: ApiError) -> MCPError:
    # A listing or a resource has no error result: the refusal is a protocol error carrying our code
    # and sentence (a refusal of the request itself, whatever it asked: invalid request).
    code = types.INVALID_REQUEST if exc.status in (401, 429) else types.INVALID_PARAMS
    return MCPError(code=code, message=f"{exc.code}: {exc.message}", data=exc.as_dict())


async def _counted_token(ctx: ServerRequestContext[Any, Any]) -> ApiToken:
    """The request's token, the request counted against its rate limit (as every tool call is)."""
    try:
        return await db(endpoint_tools.request_token, fresh=True)(token_id=_token_id(ctx))
    except ApiError as exc:
        raise _refused(exc) from None


async def _list_tools(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None):
    token = await _counted_token(ctx)
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.input_schema(),
                annotations=types.ToolAnnotations(read_only_hint=t.read_only, idempotent_hint=t.read_only),
            )
            for t in endpoint_tools.tools_for(token)
        ]
    )


async def _call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams):
    token_id = _token_id(ctx)
    ok, body = await db(endpoint_tools.tool_call, fresh=True)(
        token_id=token_id, name=params.name, arguments=params.arguments
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_json(body))], structured_content=body, is_error=not ok
    )


async def _list_resources(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None):
    token = await _counted_token(ctx)
    sessions = await db(endpoint_tools.history_conversations, fresh=True)(token=token)
    resources = [
        types.Resource(
            uri=endpoint_tools.CONVERSATIONS_URI,
            name="conversations",
            description="The conversations this token may send to.",
            mime_type="application/json",
        )
    ]
    resources += [
        types.Resource(
            uri=endpoint_tools.HISTORY_TEMPLATE.format(conversation_id=s.session_id),
            name=f"messages of {s.session_id}",
            description="The conversation's recent messages.",
            mime_type="application/json",
        )
        for s in sessions
    ]
    return types.ListResourcesResult(resources=resources)


async def _list_templates(ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None):
    await _counted_token(ctx)
    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                uri_template=endpoint_tools.HISTORY_TEMPLATE,
                name="conversation messages",
                description=f"A conversation's last {endpoint_tools.HISTORY_MESSAGES} messages (scope history).",
                mime_type="application/json",
            )
        ]
    )


async def _read_resource(ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams):
    token = await _counted_token(ctx)
    uri = str(params.uri)
    try:
        if uri == endpoint_tools.CONVERSATIONS_URI:
            body = await db(endpoint_tools.conversations_resource, fresh=True)(token=token)
        elif match := _HISTORY_URI.match(uri):
            body = await db(endpoint_tools.history_resource, fresh=True)(
                token=token, conversation_id=match["conversation_id"]
            )
        else:
            raise ApiError(ApiErrorCode.NOT_FOUND, f"no resource {uri!r}")
    except ApiError as exc:
        raise _refused(exc) from None
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, text=_json(body), mime_type="application/json")]
    )


def build_server() -> Server:
    return Server(
        "maibot",
        version="1.0.0",
        instructions=(
            "The maibot chat bot. Send or schedule messages to its conversations, read and cancel them; "
            "read and update its inner state, memory and timers (as this token's scopes allow). Errors come "
            'back as tool errors with {"code", "message", "field"?}.'
        ),
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
        on_list_resources=_list_resources,
        on_list_resource_templates=_list_templates,
        on_read_resource=_read_resource,
    )


# --- the ASGI app -----------------------------------------------------------------------------------


async def _send_json(send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body, ensure_ascii=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _header(scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == name), None)


class McpEndpoint:
    """ASGI app for /mcp: checks the Host (Django's ALLOWED_HOSTS) and the bearer token, then hands the
    request to the SDK's streamable-HTTP session manager, started on first use in this event loop."""

    def __init__(self) -> None:
        self._manager: StreamableHTTPSessionManager | None = None
        self._ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: asyncio.Task | None = None

    async def _started(self) -> StreamableHTTPSessionManager:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._runner is None or self._runner.done():
            limit = get_config().api.max_image_bytes
            manager = StreamableHTTPSessionManager(
                app=build_server(),
                stateless=True,
                json_response=True,
                # Host is checked against ALLOWED_HOSTS here, and a bearer token is required: a browser
                # led to this server by DNS rebinding has no token.
                security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
                max_request_body_size=max(4 * 1024 * 1024, limit * 4 // 3 + 64 * 1024),
            )
            ready = asyncio.Event()

            async def run() -> None:
                async with manager.run():
                    ready.set()
                    await asyncio.Event().wait()

            first = self._loop is not loop
            self._manager, self._ready, self._loop = manager, ready, loop
            self._runner = loop.create_task(run(), name="mcp-endpoint")
            self._runner.add_done_callback(_log_end)
            if first:
                # Under daphne: the manager's task group is closed before the loop goes away.
                call_before_server_shutdown(loop, self.stop)
        await self._ready.wait()
        return self._manager

    async def stop(self) -> None:
        runner = self._runner
        if runner is not None and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await _send_json(send, 404, {"code": "not_found", "message": "not found"})
        host, _ = split_domain_port(_header(scope, b"host") or "")
        if not host or not validate_host(host, settings.ALLOWED_HOSTS):
            return await _send_json(send, 400, {"code": "bad_request", "message": "this Host is not allowed"})
        authorization = _header(scope, b"authorization") or ""
        scheme, _, raw = authorization.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            error = ApiError(ApiErrorCode.NOT_AUTHENTICATED, "send Authorization: Bearer <token>")
            return await _unauthorized(send, error)
        try:
            token = await db(api_token_authenticate, fresh=True)(raw=raw)
        except ApiError as exc:
            return await _unauthorized(send, exc)
        scope = {
            **scope,
            SCOPE_TOKEN_KEY: token.pk,
            # The SDK binds a session to the credential that opened it (stateful mode) by this user.
            "user": AuthenticatedUser(AccessToken(token="", client_id=f"api-token-{token.pk}", scopes=token.scopes)),
        }
        manager = await self._started()
        await manager.handle_request(scope, receive, send)


# JSON-RPC's range for server-defined errors: the refusals that come before any MCP handler runs.
UNAUTHORIZED = -32001


async def _unauthorized(send, error: ApiError) -> None:
    # A JSON-RPC error body: the SDK's client raises it as an MCPError with our code and sentence (any
    # other 401 body it reports as "Server returned an error response").
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": UNAUTHORIZED, "message": f"{error.code}: {error.message}", "data": error.as_dict()},
    }
    await _send_json(send, 401, body, [(b"www-authenticate", b'Bearer realm="maibot"')])


def _log_end(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("the MCP endpoint's session manager stopped: %r", task.exception())


mcp_endpoint = McpEndpoint()
