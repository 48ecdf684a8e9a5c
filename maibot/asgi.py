"""ASGI entry point: HTTP (admin, API, chat page) and websockets (adapters at /ws, browser chat)."""

import asyncio
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")

from maibot.http_handler import get_pooled_asgi_application

# Django's HTTP side: each request's middleware and view in one hop on a pool of threads.
django_asgi_app = get_pooled_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from api.mcp.mount import PATHS as MCP_PATHS  # noqa: E402
from api.mcp.mount import endpoint as mcp_endpoint  # noqa: E402
from chat.gateway import GatewayRouter  # noqa: E402
from core.process import start_services_on_first_call, tune_garbage_collector  # noqa: E402
from maibot.proxies import ForwardedClientMiddleware  # noqa: E402
from maibot.routing import websocket_urlpatterns  # noqa: E402
from plugins.host import start_on_first_call as load_plugins_on_first_call  # noqa: E402
from plugins.upload_limit import limit_plugin_uploads, refuse_big_uploads_in_daphne  # noqa: E402
from scheduling.mcp.client import start_mcp_clients_on_first_call  # noqa: E402

# /ws (adapters, both maim_message wire versions, including Socket.IO's HTTP long-polling) is served
# by the gateway, /mcp by the MCP endpoint; every other HTTP request goes to Django and every other
# websocket to the routes the apps list in maibot.routing. Plugins (the data dir's plugins/ folder)
# load in this process, the one whose planner uses them. Outermost: the client address every layer
# sees (trusted proxies' X-Forwarded-For, maibot.proxies).
application = ForwardedClientMiddleware(
    load_plugins_on_first_call(
        start_services_on_first_call(
            start_mcp_clients_on_first_call(
                GatewayRouter(
                    # The admin's CSS/JS (and the console's) come from this process too: `make run` has no
                    # separate web server, and nothing may come from a CDN.
                    # A plugin upload's body is bounded before Django reads it (plugins.upload_limit).
                    http=limit_plugin_uploads(ASGIStaticFilesHandler(django_asgi_app)),
                    websocket=AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                    # The bot's own MCP endpoint (streamable HTTP), authenticated with the API's bearer tokens.
                    http_mounts={MCP_PATHS: mcp_endpoint},
                )
            )
        )
    )
)


def _start_when_the_server_runs() -> None:
    """daphne sends no lifespan events, and what starts on the first call (the plugins, whose adapter
    plugins dial their platforms themselves, the gateway, the services, the MCP links) must not wait for
    a first request: once daphne's reactor runs, the application is called once with a `lifespan`
    scope, which every layer passes through and the gateway answers by starting. Only under daphne (its
    reactor is installed before this module is imported); importing this module elsewhere starts nothing."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or "daphne.server" not in sys.modules:
        return

    async def nothing_received() -> dict:
        return {"type": "lifespan.shutdown"}

    async def nothing_sent(message: dict) -> None:
        pass

    def call() -> None:
        task = asyncio.get_running_loop().create_task(application({"type": "lifespan"}, nothing_received, nothing_sent))
        _started.add(task)
        task.add_done_callback(_started.discard)

    # Startup triggers fire before the reactor's asyncio loop runs: the call waits for its first turn.
    reactor.callWhenRunning(lambda: reactor.callLater(0, call))


_started: set[asyncio.Task] = set()
_start_when_the_server_runs()
# Under daphne, a plugin upload over its limit is refused before its body is read (plugins.upload_limit).
refuse_big_uploads_in_daphne()

# Everything loaded so far lives as long as the process: out of the garbage collector's sight, and the
# young generation collected less often.
tune_garbage_collector()
