"""ASGI entry point: HTTP (admin, API, chat page) and websockets (adapters at /ws, browser chat)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "maibot.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import URLRouter  # noqa: E402

from chat.gateway import GatewayRouter  # noqa: E402
from maibot.routing import websocket_urlpatterns  # noqa: E402

# /ws (adapters, both maim_message wire versions, including Socket.IO's HTTP long-polling) is served
# by the gateway; every other HTTP request goes to Django and every other websocket to the routes
# the apps list in maibot.routing.
application = GatewayRouter(
    http=django_asgi_app,
    websocket=AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
)
