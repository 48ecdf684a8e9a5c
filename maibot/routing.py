"""Websocket routes of the ASGI application (adapters, browser chat, live logs).

Each app contributes its routes here; the adapter endpoint `/ws` is special-cased in maibot.asgi
(it serves two wire versions).
"""

from django.urls import path

from chat.consumers import ChatPageConsumer

websocket_urlpatterns: list = [
    path("chat/ws/", ChatPageConsumer.as_asgi()),
]
