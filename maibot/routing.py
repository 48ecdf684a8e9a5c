"""Websocket routes of the ASGI application (adapters, browser chat, live logs).

Each app contributes its routes here; the adapter endpoint `/ws` is special-cased in maibot.asgi
(it serves two wire versions).
"""

from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from chat.consumers import ChatPageConsumer
from console.consumers import LogStreamConsumer

websocket_urlpatterns: list = [
    # Operators only (checked in the consumer); the Origin check stops other sites from opening it
    # with an operator's session cookie.
    path("ws/admin/logs/", AllowedHostsOriginValidator(LogStreamConsumer.as_asgi())),
    path("chat/ws/", AllowedHostsOriginValidator(ChatPageConsumer.as_asgi())),
]
