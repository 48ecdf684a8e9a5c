"""Websocket routes of the ASGI application (adapters, browser chat, live logs).

Each app contributes its routes here; the adapter endpoint `/ws` is special-cased in maibot.asgi
(it serves two wire versions).
"""

websocket_urlpatterns: list = []
