"""maibot: a MaiBot-style chat-bot core as one deployable Django project.

This package is the project (the top layer): settings, URLs, the ASGI application and its websocket
routes, the command line and the management commands. The layers it wires together live in the apps
core, chat, scheduling, api, plugins and console.
"""
